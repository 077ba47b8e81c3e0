"""Metric sinks owned by the loop: TensorBoard (tensorboardX), JSON lines, learning curve, and
Weights & Biases when ``log.wandb.project`` is set (``loop.wandb_sink``).

Hooks return flat dicts of metrics that stay on the device until a log step. A value is one
of:

* a scalar (or an array of scalars): averaged over the log window, NaN-aware;
* ``Video(frames)``: the window's last one is written as an animated GIF to
  ``videos/<name>_<step>.gif`` and to TensorBoard's image tab (animated), and as an H.264
  MP4 beside the GIF (``videos/<name>_<step>.mp4``) where ``imageio-ffmpeg`` is installed
  (``pip install -e '.[video]'``), else only the GIF;
* ``Image(pixels)``: the window's last one, to ``images/<name>_<step>.png`` and TensorBoard;
* ``Histogram(values)``: the window's values pooled into one TensorBoard histogram.

All three are pytrees, so jitted hooks return them like any array (DreamerV3's and SimPLe's
video predictions). ``metrics.jsonl`` holds one object per log step: ``{"step": x, "<name>":
value}``, with the same names as TensorBoard; media appear as their file's path relative to
the run directory. Non-finite scalars (e.g. no episode finished in the window) are left out,
not written as NaN.
"""

from __future__ import annotations

import errno
import io
import json
import math
import os
import warnings
from collections import defaultdict

import jax
import numpy as np
from flax import struct

from jaxwm.media import Histogram, Image, Video  # noqa: F401 (metric types, re-exported)


@struct.dataclass
class PerSeed:
    """``values``: [N], one scalar per seed (``loop.seeds``). A window's values are averaged
    per seed; the row holds their mean over seeds, ``<name>/seed_<k>`` and
    ``<name>/seed_std``."""

    values: jax.Array


MEDIA = (Video, Image, Histogram)


def _is_media(value) -> bool:
    return isinstance(value, MEDIA)


class MetricWindow:
    """Accumulates per-hook metrics between log steps.

    Values stay where the hooks left them (on the device) until the window is read; then all
    of them are fetched in one ``jax.device_get``, not one array at a time.
    """

    def __init__(self):
        self._values = defaultdict(list)
        self._on_host = True

    def add(self, metrics) -> None:
        for name, value in metrics.items():
            if isinstance(value, (Video, Image)):
                self._values[name] = [value]  # only the last is written: hold no others
            else:
                self._values[name].append(value)
        self._on_host = self._on_host and not metrics

    def _fetch(self) -> None:
        if not self._on_host:
            self._values = defaultdict(list, jax.device_get(dict(self._values)))
            self._on_host = True

    def nonfinite(self, prefix: str) -> list[str]:
        """Names under ``prefix`` with any non-finite value in the window."""
        self._fetch()
        return sorted(name for name, values in self._values.items() if name.startswith(prefix)
                      and not all(_is_media(v) or np.all(np.isfinite(_scalars(v)))
                                  for v in values))

    def flush(self) -> dict:
        """Scalars averaged (finite values only), media as described in the module docstring;
        empties the window."""
        self._fetch()
        out = {}
        for name, values in self._values.items():
            last = values[-1]
            if isinstance(last, Histogram):
                out[name] = Histogram(np.concatenate([np.ravel(v.values) for v in values]))
            elif _is_media(last):
                out[name] = last
            elif isinstance(last, PerSeed):
                out.update(_per_seed(name, np.stack([_scalars(v) for v in values])))
            else:
                arr = np.concatenate([np.ravel(np.asarray(v, np.float64)) for v in values])
                finite = arr[np.isfinite(arr)]
                if finite.size:
                    out[name] = float(finite.mean())
        self._values.clear()
        return out


def _scalars(value) -> np.ndarray:
    return np.asarray(value.values if isinstance(value, PerSeed) else value, np.float64)


def _per_seed(name: str, window: np.ndarray) -> dict:
    """[W, N] window of per-seed values -> the mean over seeds, each seed's, their std."""
    finite = np.isfinite(window)
    counts = finite.sum(axis=0)
    per_seed = np.where(finite, window, 0.0).sum(axis=0) / np.maximum(counts, 1)
    seen = counts > 0
    if not seen.any():
        return {}
    out = {name: float(per_seed[seen].mean()), f"{name}/seed_std": float(per_seed[seen].std())}
    out.update({f"{name}/seed_{k}": float(v) for k, v in enumerate(per_seed) if seen[k]})
    return out


def _uint8(x) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint8:
        x = (np.clip(x, 0.0, 1.0) * 255).round().astype(np.uint8)
    return x


def gif_bytes(frames, fps: int) -> bytes:
    import imageio.v2 as imageio

    frames = _uint8(frames)
    if frames.shape[-1] == 1:
        frames = frames[..., 0]
    buffer = io.BytesIO()
    imageio.mimsave(buffer, list(frames), format="GIF", duration=1000 / fps, loop=0)
    return buffer.getvalue()


def mp4_encoder() -> bool:
    """Whether an MP4 encoder is installed here: ``imageio-ffmpeg`` (the ``video`` extra,
    which brings its own ffmpeg build)."""
    try:
        import imageio_ffmpeg  # noqa: F401
    except ImportError:
        return False
    return True


def write_mp4(path: str, frames, fps: int) -> bool:
    """Writes ``frames`` ([T, H, W, C], C in (1, 3), uint8 or float in [0, 1]) to ``path`` as
    an H.264 MP4 in yuv420p (what browsers play; an odd height or width is padded by one
    edge pixel) if an encoder is installed (``mp4_encoder``); returns whether it did."""
    if not mp4_encoder():
        return False
    import imageio_ffmpeg

    frames = _uint8(frames)
    if frames.shape[-1] == 1:
        frames = np.repeat(frames, 3, axis=-1)
    _, height, width, _ = frames.shape
    if height % 2 or width % 2:
        frames = np.pad(frames, ((0, 0), (0, height % 2), (0, width % 2), (0, 0)), mode="edge")
        height, width = height + height % 2, width + width % 2
    writer = imageio_ffmpeg.write_frames(path, (width, height), fps=fps, codec="libx264",
                                         pix_fmt_in="rgb24", pix_fmt_out="yuv420p",
                                         macro_block_size=1, ffmpeg_log_level="error")
    with warnings.catch_warnings():
        # JAX warns at every fork; this one execs ffmpeg at once, which is safe.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        writer.send(None)  # starts ffmpeg
    try:
        for frame in frames:
            writer.send(np.ascontiguousarray(frame))
    finally:
        writer.close()
    return True


class MetricWriter:
    """Writes log rows to TensorBoard and ``metrics.jsonl``.

    ``resumed_at`` (the counters of the checkpoint a run resumed from) drops the rows logged
    after that checkpoint, which the resumed run logs again: from ``metrics.jsonl`` directly,
    from TensorBoard by ``purge_step`` on the x-axis. ``enabled=False`` (every process of a
    multi-process run but the first) writes nothing.
    """

    def __init__(self, workdir: str, resumed_at: dict | None = None, x_axis: str = "env_steps",
                 enabled: bool = True, config=None):
        from tensorboardX import SummaryWriter

        from jaxwm.loop import wandb_sink

        self.workdir = workdir
        self.path = os.path.join(workdir, "metrics.jsonl")
        self._tb = self._wandb = None
        if not enabled:
            return
        if config is not None and wandb_sink.wandb_block(config) is not None:
            self._wandb = wandb_sink.WandbSink(config, workdir, resumed=resumed_at is not None)
        purge_step = None
        if resumed_at is not None:
            purge_step = resumed_at[x_axis] + 1
            if os.path.exists(self.path):
                kept = [row for row in read_jsonl(self.path)
                        if all(row.get(f"counters/{unit}", 0) <= value
                               for unit, value in resumed_at.items())]
                with open(self.path + ".tmp", "w") as f:
                    f.writelines(json.dumps(row) + "\n" for row in kept)
                os.replace(self.path + ".tmp", self.path)
        self._tb = SummaryWriter(workdir, purge_step=purge_step)
        self._jsonl = open(self.path, "a")

    def _media_path(self, kind: str, name: str, step: int, ext: str) -> str:
        relative = os.path.join(kind, f"{name.replace('/', '_')}_{step}.{ext}")
        os.makedirs(os.path.join(self.workdir, kind), exist_ok=True)
        return relative

    def _write_video(self, name: str, video: Video, step: int):
        """The GIF file (and the MP4 beside it where an encoder is installed), and the
        TensorBoard event to add once the row is written."""
        from tensorboardX.proto.summary_pb2 import Summary

        data = gif_bytes(video.frames, video.fps)
        relative = self._media_path("videos", name, step, "gif")
        with open(os.path.join(self.workdir, relative), "wb") as f:
            f.write(data)
        write_mp4(os.path.join(self.workdir, relative[:-len("gif")] + "mp4"), video.frames,
                  video.fps)
        _, height, width, channels = np.shape(video.frames)
        # TensorBoard shows an image summary holding a GIF as an animation; tensorboardX's own
        # add_video needs moviepy, which this avoids.
        image = Summary.Image(height=height, width=width, colorspace=channels,
                              encoded_image_string=data)
        return relative, lambda: self._tb._get_file_writer().add_summary(
            Summary(value=[Summary.Value(tag=name, image=image)]), step)

    def _write_image(self, name: str, image: Image, step: int):
        """The PNG file, and the TensorBoard event to add once the row is written."""
        import imageio.v2 as imageio

        pixels = _uint8(image.pixels)
        relative = self._media_path("images", name, step, "png")
        imageio.imwrite(os.path.join(self.workdir, relative),
                        pixels[..., 0] if pixels.shape[-1] == 1 else pixels)
        return relative, lambda: self._tb.add_image(name, pixels, step, dataformats="HWC")

    def _check_tensorboard(self) -> None:
        """tensorboardX writes from a thread of its own; when a write fails there (a full
        disk, a quota, a file-size limit) the thread dies and later events would block on its
        full queue forever. Say so as the write error it was instead."""
        events = self._tb._get_file_writer().event_writer
        worker = getattr(events, "_worker", None)
        if worker is not None and not events._closed and not worker.is_alive():
            raise OSError(errno.ENOSPC, "TensorBoard's event writer stopped: a write of its "
                          "failed (disk full, quota or file-size limit)", self.workdir)

    def write(self, step: int, metrics: dict) -> None:
        """The row's media files and ``metrics.jsonl`` line first (written here, so a full
        disk raises at once), then TensorBoard's events (written by its thread)."""
        if self._tb is None:
            return
        row, events = {"step": int(step)}, []
        for name, value in metrics.items():
            if isinstance(value, Video):
                row[name], event = self._write_video(name, value, step)
                events.append(event)
            elif isinstance(value, Image):
                row[name], event = self._write_image(name, value, step)
                events.append(event)
            elif isinstance(value, Histogram):
                values = np.asarray(value.values, np.float64)
                events.append(lambda name=name, values=values: self._tb.add_histogram(
                    name, values, step))
            elif math.isfinite(float(value)):
                row[name] = float(value)
                events.append(lambda name=name, v=row[name]: self._tb.add_scalar(name, v, step))
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        for event in events:
            self._check_tensorboard()  # before each event: its queue holds ten
            event()
        if self._wandb is not None:
            self._wandb.write(step, row, self.workdir,
                              {k: v for k, v in metrics.items() if _is_media(v)})

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._jsonl.close()
        if self._wandb is not None:
            self._wandb.close()


def read_jsonl(path: str) -> list[dict]:
    """The rows of a JSON-lines file. A last line cut short (the run was killed, or the disk
    filled, while writing it) is left out; a bad line anywhere else is an error."""
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 1 or line.endswith("\n"):
                raise
    return rows


RETURN_SERIES = {"train (episodic return)": "charts/episodic_return",
                 "eval": "eval/episodic_return"}
SCORE_SERIES = {"eval": "eval/normalized_score"}


def write_eval_csv(jsonl_path: str, csv_path: str) -> bool:
    """The evaluation rows of ``metrics.jsonl`` as a CSV (step, counters, eval/* scalars), so
    that a run's results open in any spreadsheet. False if the run has no evaluation."""
    import csv

    rows = [r for r in (read_jsonl(jsonl_path) if os.path.exists(jsonl_path) else [])
            if "eval/episodic_return" in r]
    if not rows:
        return False
    columns = ["step"] + sorted({k for r in rows for k in r
                                 if k.startswith(("counters/", "eval/"))
                                 and not isinstance(r[k], str)})
    with open(csv_path + ".tmp", "w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    os.replace(csv_path + ".tmp", csv_path)
    return True


def plot_learning_curve(jsonl_path: str, png_path: str, title: str, x_label: str,
                        series: dict | None = None, y_label: str = "return") -> bool:
    """The ``series`` ({label: metric}; default: training and evaluation return) against the
    run's x-axis. False if nothing to plot.

    With several seeds: the mean over seeds, a band of one std across them and each seed as
    a thin line; with one seed, a ``<metric>_std`` in the rows (spread over evaluation
    episodes) is drawn as the band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(jsonl_path) if os.path.exists(jsonl_path) else []
    series = RETURN_SERIES if series is None else series
    fig, ax = plt.subplots(figsize=(7, 4))
    plotted = False
    for label, name in series.items():
        points = [(r["step"], r[name], r.get(f"{name}/seed_std", np.nan),
                   r.get(f"{name}_std", np.nan)) for r in rows if name in r]
        if not points:
            continue
        xs, ys, spread, episode_std = (np.asarray(v, np.float64)
                                       for v in zip(*points, strict=True))
        line, = ax.plot(xs, ys, marker="o" if label == "eval" else None, markersize=3,
                        label=label if np.isnan(spread).all() else f"{label}, mean ± std of seeds")
        if np.isnan(spread).all() and not np.isnan(episode_std).all():
            ax.fill_between(xs, ys - episode_std, ys + episode_std, color=line.get_color(),
                            alpha=0.2, label=f"{label} ± std over episodes")
        if not np.isnan(spread).all():
            ax.fill_between(xs, ys - spread, ys + spread, color=line.get_color(), alpha=0.2)
            for k in range(max(int(n.rsplit("_", 1)[1]) for r in rows for n in r
                               if n.startswith(f"{name}/seed_") and n[-1].isdigit()) + 1):
                seed = [(r["step"], r[f"{name}/seed_{k}"]) for r in rows
                        if f"{name}/seed_{k}" in r]
                if seed:
                    ax.plot(*zip(*seed, strict=True), color=line.get_color(), alpha=0.3,
                            linewidth=0.6)
        plotted = True
    if plotted:
        ax.set_xlabel(x_label.replace("_", " "))
        ax.set_ylabel(y_label)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(png_path, dpi=120)
    plt.close(fig)
    return plotted
