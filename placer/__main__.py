from placer.cli import main

raise SystemExit(main())
