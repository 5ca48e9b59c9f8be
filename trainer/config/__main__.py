"""``python -m trainer.config --markdown``: print the reference page docs/config.md."""

from trainer.config.docs import main

raise SystemExit(main())
