"""Names of the export overrides that refusals cite, so a message and the CLI never disagree."""

PARTIAL_OVERRIDE_FLAG = "--accept-partial-line"
STALE_OVERRIDE_FLAG = "--accept-stale-aggregates"
