"""``python -m wide_compile`` runs the ``wide-compile`` command line."""

from wide_compile.cli import main

raise SystemExit(main())
