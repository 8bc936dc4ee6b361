"""The chat page at `GET /ui` (`page.py`) and the static files it serves (`static/`), shipped in the package."""
