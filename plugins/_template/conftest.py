"""Lets the tests run from a source checkout, before `pip install -e .`."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
