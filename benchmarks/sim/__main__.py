from __future__ import annotations

from benchmarks.sim import main

raise SystemExit(main())
