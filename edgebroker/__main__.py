from edgebroker.cli.main import main

raise SystemExit(main())
