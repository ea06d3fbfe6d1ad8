"""Lets the plugin's tests run from a source checkout without installing it."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
