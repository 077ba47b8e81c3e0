"""``python -m jaxwm.report runs/... --out report/`` (``jaxwm.report.main``)."""

import sys

from jaxwm.report import main

sys.exit(main())
