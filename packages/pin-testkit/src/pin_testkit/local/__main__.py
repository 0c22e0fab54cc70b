"""``python -m pin_testkit.local``: the same as the ``pin-local`` command."""

from pin_testkit.local.cli import main

raise SystemExit(main())
