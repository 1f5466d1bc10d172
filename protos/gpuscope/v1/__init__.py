"""gpuscope's wire: generated messages and services (see the .proto files),
plus the wire-level constants that are not message fields."""

# Trailing metadata of an Ingest stream aborted with INVALID_ARGUMENT: the seq
# of the batch that was refused, so the agent drops that batch and resends the rest.
REJECTED_SEQ_KEY = "gpuscope-rejected-seq"
# Initial metadata of a Commands stream the analyzer accepted, sent at once: the
# agent then reads a later reset as the analyzer going away, not as a refusal.
ACCEPTED_KEY = "gpuscope-commands-accepted"
# Said in an UNAVAILABLE's details when the analyzer answered but its store did not
# take what was sent (a full disk): clients tell that from an analyzer out of reach.
NOT_STORED = "not stored, resend later"
