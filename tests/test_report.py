"""jaxwm.report on synthetic run directories with known answers."""

import json
import os

import numpy as np
import pytest

from jaxwm.report import ReportError, main, make_report
from jaxwm.report.runs import env_streams, find_runs, load_run, shared_env_streams

METRIC = "eval/episodic_return"


def write_run(path, finals, env_id="CartPole-v1", lr=1e-3, steps=(100, 200, 300), progress=1.0,
              algo="ppo", seed=0, truncate=False, offline=False):
    """A run directory: config.json, and metrics.jsonl with eval rows rising linearly to
    ``finals`` (one value: a one-seed run; several: a num_seeds run's seed columns).
    ``offline``: logged against agent updates, with no env-step counter (MOPO, diffusion)."""
    os.makedirs(path, exist_ok=True)
    counter = "agent_updates" if offline else "env_steps"
    config = {"algo": algo, "seed": seed, "total_env_steps": steps[-1], "num_seeds": len(finals),
              "env": {"id": env_id}, "ppo": {"lr": lr},
              "log": {"every": f"100 {counter}", "x_axis": counter}}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for i, step in enumerate(steps):
            frac = (i + 1) / len(steps)
            row = {"step": step, f"counters/{counter}": step, "charts/wall_seconds": 10.0 * step,
                   "charts/progress": progress * frac, METRIC: float(np.mean(finals)) * frac}
            if len(finals) > 1:
                row.update({f"{METRIC}/seed_{k}": v * frac for k, v in enumerate(finals)})
            f.write(json.dumps(row) + "\n")
        if truncate:
            f.write('{"step": 400, "counters/env_steps": 400, "eval/episodic_ret')
    return path


def edit_config(path, edit):
    """Rewrites a run's config.json as ``edit(config)`` leaves it."""
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    edit(config)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


def report(tmp_path, paths, **kwargs):
    return make_report([str(p) for p in paths], str(tmp_path / "out"), log=lambda m: None,
                       reps=500, **kwargs)


def test_iqm_of_a_known_set(tmp_path):
    """Eight seeds scoring 1..8 on one task: the IQM is the mean of the middle four, 4.5; the
    mean 4.5, the median 4.5; a num_seeds run's seed columns are its seeds."""
    write_run(tmp_path / "runs" / "a", [1, 2, 3, 4, 5, 6, 7, 8])
    out = report(tmp_path, [tmp_path / "runs"], normalize="dmc")
    (values,) = out.aggregates.values()
    assert values["IQM"][0] == pytest.approx(4.5 / 1000)
    assert values["Median"][0] == pytest.approx(4.5 / 1000)
    assert values["Optimality gap"][0] == pytest.approx(1 - 4.5 / 1000)
    assert out.table[0]["seeds"] == 8
    assert out.table[0]["final"][0] == pytest.approx(4.5 / 1000)

    skewed = [0, 0, 10, 10, 10, 10, 1000, 1000]  # IQM drops the tails: mean of the 10s
    write_run(tmp_path / "skew" / "a", skewed)
    out = report(tmp_path, [tmp_path / "skew"])
    (values,) = out.aggregates.values()
    assert values["IQM"][0] == pytest.approx(10.0)
    assert values["Mean"][0] == pytest.approx(np.mean(skewed))
    assert "Optimality gap" not in values  # raw returns have no "solved" at 1


def test_ci_covers_the_true_mean_on_a_seeded_bootstrap(tmp_path):
    rng = np.random.default_rng(0)
    finals = list(rng.normal(50.0, 5.0, size=12))
    for k, v in enumerate(finals):
        write_run(tmp_path / "runs" / f"s{k}", [v], seed=k)
    out = report(tmp_path, [tmp_path / "runs"])
    mean, low, high = out.table[0]["final"]
    assert mean == pytest.approx(np.mean(finals))
    assert low < 50.0 < high
    assert high - low < 10.0  # ~ 4 standard errors of 5 / sqrt(12)
    again = report(tmp_path, [tmp_path / "runs"])
    assert again.table[0]["final"] == out.table[0]["final"]  # seeded: the same CI


def test_groups_by_the_settings_that_differ(tmp_path):
    """Two learning rates x two tasks x two seeds: groups are (lr, task); the seed never
    splits one; aggregates are per lr, over the two tasks, with P(improvement) between
    them."""
    for lr, good in ((1e-3, 100.0), (1e-4, 10.0)):
        for env_id in ("CartPole-v1", "Acrobot-v1"):
            for seed in (0, 1):
                write_run(tmp_path / "runs" / f"{lr}_{env_id}_{seed}", [good + seed], env_id=env_id,
                          lr=lr, seed=seed)
    out = report(tmp_path, [tmp_path / "runs"])
    assert len(out.table) == 4
    assert {(r["env.id"], r["ppo.lr"]) for r in out.table} == {
        (e, lr) for e in ("CartPole-v1", "Acrobot-v1") for lr in (1e-3, 1e-4)}
    assert all(r["seeds"] == 2 for r in out.table)
    assert set(out.aggregates) == {"ppo.lr=0.001", "ppo.lr=0.0001"}
    assert out.improvement[("ppo.lr=0.001", "ppo.lr=0.0001")][0] == pytest.approx(1.0)
    for name in ("table.md", "table.csv", "curves_env_steps.png", "curves_wall_time.png",
                 "aggregates.png", "performance_profile.png"):
        assert os.path.getsize(tmp_path / "out" / name) > 0
    by_algo = report(tmp_path, [tmp_path / "runs"], group_by=["algo"])
    assert len(by_algo.table) == 1 and by_algo.table[0]["seeds"] == 8


def test_several_algorithms_get_a_table_each_with_only_their_own_settings(tmp_path):
    """ppo at two learning rates and dreamer, whose config keys all differ from ppo's: one
    table per algorithm, its columns the settings that differ among that algorithm's runs
    (not one column per key of either algorithm), the seeds counted, not listed."""
    for lr in (1e-3, 1e-4):
        for seed in (0, 1000):
            write_run(tmp_path / "runs" / f"ppo_{lr}_{seed}", [10.0], lr=lr, seed=seed)
    for seed in (0, 1000):
        path = write_run(tmp_path / "runs" / f"dreamer_{seed}", [5.0], algo="dreamer", seed=seed)
        edit_config(path, lambda c: (c.pop("ppo"), c.update(dreamer={"horizon": 15, "lr": 4e-5})))
    out = report(tmp_path, [tmp_path / "runs"])
    text = out.markdown
    dreamer = text[text.index("\n## dreamer\n"):text.index("\n## ppo\n")]
    ppo = text[text.index("\n## ppo\n"):text.index("\n## Aggregates")]
    assert "| seeds | status |" in dreamer and "ppo." not in dreamer
    assert "| ppo.lr | seeds | status |" in ppo and "dreamer." not in ppo
    assert [(r["algo"], r.get("ppo.lr"), r["seeds"]) for r in out.table] == [
        ("dreamer", None, 2), ("ppo", 0.0001, 2), ("ppo", 0.001, 2)]
    assert not any(k.startswith("dreamer.") for r in out.table for k in r)
    assert set(out.aggregates) == {"algo=dreamer", "algo=ppo, ppo.lr=0.0001",
                                   "algo=ppo, ppo.lr=0.001"}
    with open(tmp_path / "out" / "table.csv") as f:
        assert f.readline().startswith("algo,ppo.lr,seeds,status,")


def test_runs_whose_envs_overlap_are_named(tmp_path):
    """Separate runs with seeds 1 and 2 share envpool's envs 2.. of their pools (env i is
    seeded seed + i), so their seeds are not independent: the report says so; seeds 1000
    apart share none."""
    def run(name, seed, num_envs=8):
        path = write_run(tmp_path / name / f"s{seed}", [10.0 + seed], seed=seed)
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        config["env"]["num_envs"] = num_envs
        config["eval"] = {"num_envs": 5, "num_episodes": 10}
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(config, f)
        return load_run(path, METRIC)[0]

    close, apart = [run("close", s) for s in (1, 2, 3)], [run("apart", s) for s in (1000, 2000)]
    assert env_streams(close[0]) == {"evaluation": set(range(10_001, 10_006)),
                                     "training": set(range(1, 9))}
    note = shared_env_streams(close)
    assert note.startswith("3 pair(s) of runs share envs") and "(seed 1)" in note
    assert "4 of 5 evaluation envs and 7 of 8 training envs" in note
    assert shared_env_streams(apart) == ""
    out = report(tmp_path, [tmp_path / "close"])
    assert "pair(s) of runs share envs" in out.markdown
    assert "share envs" not in report(tmp_path, [tmp_path / "apart"]).markdown


def test_half_written_metrics_are_read_to_the_last_full_row(tmp_path):
    path = write_run(tmp_path / "run", [3.0], truncate=True, progress=0.5)
    run, why = load_run(str(path), METRIC)
    assert why == "" and list(run.seeds[0].env_steps) == [100, 200, 300]
    out = report(tmp_path, [path])
    assert out.table[0]["status"] == "1 of 1 in progress (from 50%)"


def test_a_half_written_row_never_hides_the_final_evaluation(tmp_path):
    """A crash mid-write leaves a row cut short: as the last line with or without its newline,
    or with a restarted run's next row written onto it. The complete rows around it count
    (the final evaluation is the last whole one), the broken line is named in one line, and a
    file holding nothing but a cut row is not called empty."""
    cut = '{"step": 400, "counters/env_steps": 400, "eval/episodic_ret'
    for name, tail in (("newline", cut + "\n"), ("none", cut)):
        path = write_run(tmp_path / "runs" / name, [3.0])
        with open(os.path.join(path, "metrics.jsonl"), "a") as f:
            f.write(tail)
        run, why = load_run(str(path), METRIC)
        assert why == "" and run.seeds[0].final == pytest.approx(3.0), why
        assert run.note == "skipped metrics.jsonl's line 4: not a whole row (cut short mid-write?)"

    glued = write_run(tmp_path / "runs" / "glued", [3.0])
    with open(os.path.join(glued, "metrics.jsonl")) as f:
        lines = f.readlines()
    with open(os.path.join(glued, "metrics.jsonl"), "w") as f:
        f.writelines([lines[0], cut + lines[1], lines[2]])
    run, why = load_run(str(glued), METRIC)
    assert why == "" and list(run.seeds[0].env_steps) == [100, 300]
    assert run.seeds[0].final == pytest.approx(3.0) and "line 2" in run.note

    only = write_run(tmp_path / "runs" / "only", [1.0])
    with open(only / "metrics.jsonl", "w") as f:
        f.write(cut)
    run, why = load_run(str(only), METRIC)
    assert run is None and "empty" not in why and "cut short" in why

    lines = []
    out = make_report([str(tmp_path / "runs")], str(tmp_path / "out"), log=lines.append, reps=200)
    assert out.table[0]["seeds"] == 3 and out.table[0]["final"][0] == pytest.approx(3.0)
    assert sum("not a whole row" in line for line in lines) == 3
    assert all("\n" not in line for line in lines)


def test_curves_against_env_steps_or_one_line_that_says_why_not(tmp_path):
    """curves_env_steps.png draws the runs that count env steps; offline runs, which count
    none, are drawn against their own counter (curves_agent_updates.png), and one line says
    so, whether they are all of the runs or some."""
    for seed in (0, 1000):
        write_run(tmp_path / "offline" / f"s{seed}", [-100.0], algo="mopo", seed=seed,
                  offline=True)
    lines = []
    out = make_report([str(tmp_path / "offline")], str(tmp_path / "out"), log=lines.append,
                      reps=200)
    assert "curves_env_steps.png" not in out.files
    assert {"curves_agent_updates.png", "curves_wall_time.png"} <= set(out.files)
    assert not os.path.exists(tmp_path / "out" / "curves_env_steps.png")
    (why,) = [line for line in lines if "curves_env_steps.png" in line]
    assert why.startswith("jaxwm.report: no curves_env_steps.png: no run counts env steps")
    assert "curves_agent_updates.png" in why and "\n" not in why

    write_run(tmp_path / "both" / "ppo", [10.0])
    write_run(tmp_path / "both" / "mopo", [-100.0], algo="mopo", offline=True)
    lines = []
    out = make_report([str(tmp_path / "both")], str(tmp_path / "out2"), log=lines.append,
                      reps=200)
    assert {"curves_env_steps.png", "curves_agent_updates.png"} <= set(out.files)
    (why,) = [line for line in lines if "curves_env_steps.png" in line]
    assert why.startswith("jaxwm.report: curves_env_steps.png leaves out algo=mopo")


def test_a_run_with_one_evaluation_is_drawn_as_a_point(tmp_path, monkeypatch):
    """One evaluation per seed: each figure shows the mean as a marker (a line through one
    point draws nothing), and the figures are written."""
    from jaxwm.report import figures

    drawn = {}
    curves = figures.curves

    def recording(panels, path, *args):
        drawn[os.path.basename(path)] = panels
        return curves(panels, path, *args)

    monkeypatch.setattr(figures, "curves", recording)
    for seed in (0, 1000):
        write_run(tmp_path / "runs" / f"s{seed}", [10.0 + seed / 100], steps=(100,), seed=seed)
    out = report(tmp_path, [tmp_path / "runs"])
    assert {"curves_env_steps.png", "curves_wall_time.png"} <= set(out.files)
    for name in ("curves_env_steps.png", "curves_wall_time.png"):
        fig = figures.draw_curves(drawn[name], "x", "y")
        (mean, *_) = [line for line in fig.axes[0].lines if line.get_marker() == "o"]
        assert len(mean.get_xdata()) == 1 and mean.get_ydata()[0] == pytest.approx(15.0)


def test_figures_label_axes_in_words_and_name_a_one_task_aggregate():
    """Axis labels are words, not metric keys; the aggregate plot names each method's tasks
    and runs, and says where an aggregate covers one task (its seeds alone)."""
    from jaxwm.report import figures

    line = (np.arange(3.0), np.ones(3), np.zeros(3), 2 * np.ones(3), np.ones((2, 3)))
    fig = figures.draw_curves({"CartPole-v1": {"ppo": line}}, "env_steps", "eval/episodic_return")
    assert fig.axes[0].get_xlabel() == "env steps"
    assert fig.axes[0].get_ylabel() == "evaluation return (mean over episodes)"
    estimates = {"Median": (1.0, 0.5, 1.5), "IQM": (1.0, 0.5, 1.5), "Mean": (1.0, 0.5, 1.5)}
    fig = figures.draw_aggregates({"ppo": estimates, "sac": estimates}, "eval/episodic_return",
                                  tasks={"ppo": 1, "sac": 3}, runs={"ppo": 5, "sac": 2}, reps=100)
    labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    assert "ppo (1 task x 5 runs)" in labels and "sac (3 tasks x 2 runs)" in labels
    assert "ppo: one task, so each aggregate is over its runs alone" in fig._suptitle.get_text()
    assert "sac:" not in fig._suptitle.get_text()


def test_runs_without_metrics_are_named_and_skipped(tmp_path):
    write_run(tmp_path / "runs" / "good", [1.0])
    os.makedirs(tmp_path / "runs" / "empty")
    with open(tmp_path / "runs" / "empty" / "config.json", "w") as f:
        json.dump({"algo": "ppo", "env": {"id": "CartPole-v1"}}, f)
    assert find_runs([str(tmp_path / "runs")]) == [str(tmp_path / "runs" / "empty"),
                                                   str(tmp_path / "runs" / "good")]
    out = report(tmp_path, [tmp_path / "runs"])
    assert out.skipped == [(str(tmp_path / "runs" / "empty"), "no metrics.jsonl yet")]
    assert "skipped" in out.markdown and len(out.table) == 1


@pytest.mark.parametrize("kwargs, message", [
    ({"normalize": "atari"}, "unknown normalisation 'atari'"),
    ({"normalize": "atari_hns"}, "no reference returns for CartPole-v1"),
    ({"metric": "eval/nope"}, "no run has 'eval/nope'"),
    ({"ci": "always"}, "needs 2 or more seeds"),
    ({"group_by": ["ppo.lrr"]}, "not a config setting of any run; did you mean"),
])
def test_bad_input_is_one_line_that_says_what_to_do(tmp_path, kwargs, message):
    write_run(tmp_path / "runs" / "a", [1.0])
    with pytest.raises(ReportError, match=message):
        report(tmp_path, [tmp_path / "runs"], **kwargs)


def test_no_runs_and_the_command_line(tmp_path, capsys):
    os.makedirs(tmp_path / "nothing")
    assert main([str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 2
    assert "no run directories" in capsys.readouterr().err
    write_run(tmp_path / "runs" / "a", [1.0, 2.0])
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--reps", "200"]) == 0
    printed = capsys.readouterr().out
    assert "| seeds |" in printed and "1.5 [" in printed


def test_auto_normalisation_scores_each_task_as_it_is_published(tmp_path):
    """By default Atari 100k games are human-normalised, DMC tasks divided by 1000, and envs
    with no published normalisation (CartPole) stay raw."""
    from jaxwm.report import auto_normalization

    assert [auto_normalization(e) for e in ("Pong-v5", "CheetahRun-v1", "Hopper-v4",
                                            "CartPole-v1")] == ["atari_hns", "dmc", "d4rl", "raw"]
    assert [auto_normalization(e) for e in (
        "playground:CartpoleBalance", "craftax:Craftax-Classic-Symbolic-v1", "crafter",
        "gymnax:Breakout-MinAtar")] == ["dmc", "craftax", "craftax", "raw"]
    write_run(tmp_path / "runs" / "pong", [14.6], env_id="Pong-v5")  # human level
    write_run(tmp_path / "runs" / "cheetah", [500.0], env_id="CheetahRun-v1")
    out = report(tmp_path, [tmp_path / "runs"])
    finals = {r["env.id"]: r["final"][0] for r in out.table}
    assert finals == {"Pong-v5": pytest.approx(1.0), "CheetahRun-v1": pytest.approx(0.5)}
    assert "normalised score (atari_hns, dmc)" in out.markdown


def write_achievements(path, rows, seeds=1):
    """Appends rows of achievement metrics to a run's metrics.jsonl: each row
    ``(env_steps, space, episodes, {name: per-seed rates})``."""
    with open(os.path.join(path, "metrics.jsonl"), "a") as f:
        for step, space, episodes, rates in rows:
            row = {"step": step, "counters/env_steps": step, "charts/progress": 1.0}
            if space == "charts":
                row["charts/episodes"] = float(np.mean(episodes))
                row["charts/episodic_return"] = 1.0
                if seeds > 1:
                    row.update({f"charts/episodes/seed_{k}": e for k, e in enumerate(episodes)})
            for name, per_seed in rates.items():
                column = f"{space}/achievements/{name}"
                row[column] = float(np.mean(per_seed))
                if seeds > 1:
                    row.update({f"{column}/seed_{k}": v for k, v in enumerate(per_seed)})
            f.write(json.dumps(row) + "\n")


def test_achievements_give_success_rates_and_crafters_score(tmp_path):
    """Two seeds on Craftax-Classic: the eval table takes each seed's last evaluation and
    Crafter's score of each seed's rates in percent, exp(mean ln(1 + s)) - 1 (hand-computed
    below); the training one weights windows by their episodes (Crafter's protocol)."""
    run = write_run(tmp_path / "runs" / "a", [11.0, 5.5], env_id="craftax:Craftax-Classic-Pixels-v1",
                    steps=(100, 200, 300))
    write_achievements(run, [
        (100, "eval", None, {"collect_wood": [0.0, 0.0], "place_table": [0.0, 0.0]}),
        (300, "eval", None, {"collect_wood": [1.0, 0.5], "place_table": [0.0, 0.25]}),
        (100, "charts", [1, 3], {"collect_wood": [1.0, 0.0], "place_table": [0.0, 0.0]}),
        (200, "charts", [3, 1], {"collect_wood": [0.0, 1.0], "place_table": [0.5, 0.0]})],
        seeds=2)
    out = report(tmp_path, [tmp_path / "runs"])
    assert out.table[0]["final"][0] == pytest.approx(100 * 8.25 / 22)  # % of max (22)
    assert {"achievements.csv", "achievements.png"} <= set(out.files)
    scores_by_seed = [np.sqrt(101 * 1) - 1, np.sqrt(51 * 26) - 1]
    rows = {line.split(" | ")[0].strip("| *"): line for line in out.markdown.splitlines()
            if line.startswith("| ")}
    assert f"{np.mean(scores_by_seed):.1f} [" in rows["Crafter score"]
    assert rows["collect_wood"].endswith("| 75.0 |")  # (100 + 50) / 2
    assert rows["place_table"].endswith("| 12.5 |")

    out = report(tmp_path, [tmp_path / "runs"], metric="charts/episodic_return")
    rows = {line.split(" | ")[0].strip("| *"): line for line in out.markdown.splitlines()
            if line.startswith("| ")}
    # seed 0: wood (1 x 1 + 0 x 3) / 4 = 25%, table 37.5%; seed 1: wood 25%, table 0%
    assert rows["collect_wood"].endswith("| 25.0 |")
    assert rows["place_table"].endswith("| 18.8 |")
    with open(tmp_path / "out" / "achievements.csv") as f:
        assert "crafter_score" in f.read()


def test_runs_without_achievements_get_no_achievements_section(tmp_path):
    write_run(tmp_path / "runs" / "a", [1.0, 2.0])
    out = report(tmp_path, [tmp_path / "runs"])
    assert "Achievements" not in out.markdown and "achievements.png" not in out.files
