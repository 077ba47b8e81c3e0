"""Tools above the algorithms: command-line programs that train, evaluate or collect with
whole runs (``jaxwm.runner``), such as ``make_dataset``. Nothing below ``jaxwm.train`` and
``jaxwm.runner`` imports them."""
