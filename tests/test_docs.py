"""The docs cannot drift from the code.

Every ``jaxwm train`` command in README.md, docs/*.md and benchmarks/README.md is run as
``jaxwm train ... --dry_run`` (in this process: parsed, validated, the env probed, nothing
written); where a doc shows the error a command gives (``$ jaxwm train ...`` followed by a
``jaxwm train: ...`` line), the code must give that error. Every other ``jaxwm`` command's
subcommand answers ``--help`` (``jaxwm configs ...`` runs for real), every relative link and
figure exists, every ``ALGO:VARIANT`` named is a packaged config, every registered algorithm
has its page in docs/ that the README links, and the README stays a day-one page (under 250
lines). docs/notes/ is left out of the command and config checks (dated lab notes keep the
commands of their day) but not of the link check.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import io
import os
import re
import shlex

import pytest

from jaxwm import algos, cli, configs, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = sorted(["README.md", "benchmarks/README.md"]
              + [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))])
NOTES = sorted(os.path.relpath(p, ROOT)
               for p in glob.glob(os.path.join(ROOT, "docs", "notes", "*.md")))
# Each registered algorithm's page in docs/, aliases mapped by hand: a new algorithm fails
# test_every_registered_algorithm_has_its_page until it has a page and an entry here.
PAGES = {
    "diffusion": "diffusion.md",
    "dreamer": "dreamer.md",
    "gormpo": "mopo.md",  # GORMPO is MOPO with a density penalty (--config.algo=gormpo)
    "mbrs": "mbrs.md",
    "mopo": "mopo.md",
    "pairing": "pairing.md",
    "ppo": "ppo.md",
    "sac": "sac.md",
    "simple": "simple.md",
    "tdmpc2": "tdmpc2.md",
    "worldmodels": "worldmodels.md",
}


@dataclasses.dataclass(frozen=True)
class Command:
    where: str  # path:line
    text: str  # the command, its trailing comment dropped
    shown_error: str | None  # the line a doc shows it printing, if it shows an error


def commands(markdown: str, where: str) -> list[Command]:
    """The ``jaxwm`` / ``python -m jaxwm...`` commands in ``markdown``'s fenced blocks
    (``$ `` prompts and ``\\`` continuations read as a shell would)."""
    found, in_block, pending, start = [], False, "", 0
    lines = markdown.splitlines()
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            in_block, pending = not in_block, ""
            continue
        if not in_block:
            continue
        text = line.strip().removeprefix("$ ")
        if pending:
            text = f"{pending} {text}"
        else:
            start = number
        if text.endswith("\\"):
            pending = text[:-1].strip()
            continue
        pending = ""
        if not re.match(r"(jaxwm [a-z-]+|python -m jaxwm\.[a-z_]+)( |$)", text):
            continue
        text = re.split(r"\s+#", text)[0].strip()
        following = lines[number].strip() if number < len(lines) else ""
        shown = following if line.strip().startswith("$ ") and \
            re.match(r"jaxwm [a-z-]+: ", following) else None
        found.append(Command(f"{where}:{start}", text, shown))
    return found


def documented_commands() -> list[Command]:
    return [c for path in DOCS
            for c in commands(open(os.path.join(ROOT, path)).read(), path)]


def split(command: Command) -> tuple[str, list[str]]:
    """(the subcommand, its arguments): ``jaxwm train X`` and ``python -m jaxwm.train X``
    alike; a pipe and what follows it are dropped."""
    words = shlex.split(command.text.split(" | ")[0])
    if words[0] == "jaxwm":
        return words[1], words[2:]
    module = words[2].removeprefix("jaxwm.")
    return module.replace("_", "-"), words[3:]


def run_quietly(fn, *args) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        status = fn(*args)
    return status, out.getvalue()


def problem(command: Command) -> str | None:
    """What is wrong with a documented command (``None``: nothing)."""
    name, args = split(command)
    if name == "train":
        # An error shown for a resume may need the saved run (its checkpoint, its config),
        # and one for a missing package its absence: here the command may pass instead.
        needs_context = "--config.resume=True" in args or "pip install" in (command.shown_error
                                                                              or "")
        status, output = run_quietly(train.main, ["jaxwm train", *args, "--dry_run"])
        printed = [line for line in output.splitlines() if line.startswith("jaxwm train: ")]
        if command.shown_error is None or (needs_context and status == 0):
            return None if status == 0 else f"exit {status}: {output[-1000:]}"
        if status == 0 or not printed:
            return f"the doc shows {command.shown_error!r}; the command succeeded"
        if printed[0] != command.shown_error:
            return f"the doc shows {command.shown_error!r}; the code prints {printed[0]!r}"
        return None
    if name not in cli.COMMANDS:
        return f"no command {name!r} (jaxwm's: {', '.join(cli.COMMANDS)})"
    if name == "configs":
        status, output = run_quietly(cli.main, ["configs", *args])
    else:
        status, output = run_quietly(cli.main, [name, "--help"])
    return None if status == 0 else f"exit {status}: {output[-1000:]}"


COMMANDS = documented_commands()


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_every_documented_command_runs_as_shown(command):
    assert problem(command) is None, problem(command)


def test_the_check_catches_a_broken_command_and_a_drifted_error():
    doc = ("```bash\njaxwm train --config=ppo:cartpole --config.ppo.lerning_rate=3e-4\n"
           "jaxwm trian --config=ppo:cartpole\n"
           "$ jaxwm train --config=ppo:cartpole --config.ppo.num_minibatches=7\n"
           "jaxwm train: an error the code no longer prints\n"
           "jaxwm train --config=ppo:cartpole \\\n    --config.ppo.gamma=0.9  # fine\n```\n")
    typo, unknown, drifted, fine = commands(doc, "doc.md")
    assert "lerning_rate" in problem(typo)
    assert "no command 'trian'" in problem(unknown)
    assert "the code prints 'jaxwm train: ppo.num_minibatches=7" in problem(drifted)
    assert fine.where == "doc.md:6" and problem(fine) is None


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_and_figure_exists():
    missing = []
    for path in DOCS + NOTES:
        for target in LINK.findall(open(os.path.join(ROOT, path)).read()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            file = os.path.normpath(os.path.join(ROOT, os.path.dirname(path),
                                                 target.split("#")[0]))
            if not os.path.exists(file):
                missing.append(f"{path}: {target}")
    assert not missing, missing


def test_every_config_variant_named_in_the_docs_exists():
    names, unknown = set(configs.names()), []
    for path in DOCS:
        text = open(os.path.join(ROOT, path)).read()
        for name, variant in re.findall(r"(?<![\w./-])([a-z0-9]+):([a-z][a-z0-9_]*)\b", text):
            if name in names and variant not in configs.variants(name):
                unknown.append(f"{path}: {name}:{variant}")
    assert not unknown, unknown


def test_the_architecture_page_lists_every_module_and_package():
    """docs/architecture.md's layer list names each top-level module and package of jaxwm,
    and nothing that is not one."""
    text = open(os.path.join(ROOT, "docs", "architecture.md")).read()
    layers = text.split("## Layers", 1)[1].split("```")[1]
    listed = set(re.findall(r"^jaxwm/(\w+)(?:\.py|/)", layers, flags=re.MULTILINE))
    package = os.path.join(ROOT, "jaxwm")
    actual = {name.removesuffix(".py") for name in os.listdir(package)
              if (name.endswith(".py") and name != "__init__.py")
              or os.path.isfile(os.path.join(package, name, "__init__.py"))}
    assert listed == actual, (f"missing: {sorted(actual - listed)}, "
                              f"not in jaxwm: {sorted(listed - actual)}")


def test_every_registered_algorithm_has_its_page():
    """Each name in ``jaxwm.algos.names()`` has a page in docs/ (PAGES maps aliases such as
    gormpo -> mopo.md) that the README links."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    linked = {os.path.normpath(target.split("#")[0]) for target in LINK.findall(readme)}
    problems = []
    for name in algos.names():
        page = PAGES.get(name)
        if page is None:
            problems.append(f"{name}: no page in tests/test_docs.py's PAGES")
        elif not os.path.isfile(os.path.join(ROOT, "docs", page)):
            problems.append(f"{name}: docs/{page} does not exist")
        elif os.path.join("docs", page) not in linked:
            problems.append(f"{name}: README.md does not link docs/{page}")
    assert not problems, problems


def test_the_readme_stays_a_day_one_page():
    lines = open(os.path.join(ROOT, "README.md")).read().count("\n")
    assert lines < 250, f"README.md has {lines} lines; move what a new user does not need on " \
        "day one to docs/ (user_guide.md or a system's page) or docs/notes/"
