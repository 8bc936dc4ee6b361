from __future__ import annotations

from sessiongate.benchmarks.sim import main

raise SystemExit(main())
