from healer.cli import main

raise SystemExit(main())
