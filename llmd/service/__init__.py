"""Running as a system service: `notify` (sd_notify, watchdog, status), `metrics` (Prometheus), `install`."""
