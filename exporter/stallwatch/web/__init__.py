"""HTTP: the bounded server (`server`), TLS and basic auth (`tls`, `auth`), the metrics exposition
(`exposition`), the routes (`routes`) and the status page's HTML (`statuspage`, `static/`)."""
