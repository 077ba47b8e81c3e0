"""Stand-in for opencv: MBARC calls setNumThreads at import; its frame resizing (real envs)
and windows are off the benchmark's paths, so they raise here."""
WINDOW_NORMAL = 0
COLOR_RGB2GRAY = 7
INTER_AREA = 3
INTER_NEAREST = 0


def setNumThreads(n):  # noqa: N802 (opencv's name)
    pass


def _unused(*args, **kwargs):
    raise NotImplementedError("cv2 stand-in: only setNumThreads is available (mbarc_shims)")


namedWindow = imshow = waitKey = destroyWindow = cvtColor = resize = _unused  # noqa: N816
