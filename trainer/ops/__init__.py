"""Watching a run: metrics files and MLflow (``metrics``), Prometheus series (``prometheus``), ``rft
status`` (``status``) and the CPU kernel settings that make a run repeat exactly (``cpu_kernels``).
Imported by module; nothing is re-exported here."""
