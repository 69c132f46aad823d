"""Test helpers shared by the test modules (no test module imports another): the exporter and simulated engines as
processes (`harness`), root sandboxes (`sandbox`), engine transcripts (`transcripts`), a fake clock and watchers
(`units`), paths (`paths`)."""
