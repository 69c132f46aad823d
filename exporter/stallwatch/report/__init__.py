"""The evidence and the verdict on one server, behind `stallwatch diagnose` and `/servers/<name>`: the report's
model (`model`, with `diagnose.schema.json`), what is observed of a server (`observe`), the alert rules' logic on
one look (`verdict`), py-spy stacks (`stacks`), the text (`render`), and the two ways to make one: a one-shot look
(`oneshot`) and the running exporter's state (`live`)."""
