from .runs.cli import main

raise SystemExit(main())
