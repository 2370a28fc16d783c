"""`python -m deploy space --target cpu|gpu|zerogpu OUT [--model ID] [--quantization none|4bit|8bit]`."""

import sys

from .cli import main

sys.exit(main())
