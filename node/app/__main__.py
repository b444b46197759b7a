from node.app.main import main

raise SystemExit(main())
