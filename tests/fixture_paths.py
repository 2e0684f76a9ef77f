"""Where the real-output fixtures live: one source for every test, example and benchmark.

``tests/fixtures/`` is part of the repository (a clone needs nothing beside it); its README says
where each folder came from and how it was made.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NEMO_GYM_FIXTURES = FIXTURES / "nemo-gym-0.7.0"
REACTOR_FIXTURES = FIXTURES / "reactor-2.7.6"
