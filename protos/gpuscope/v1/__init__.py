"""gpuscope's wire: generated messages and services (see the .proto files),
plus the one wire-level constant that is not a message field."""

# Trailing metadata of an Ingest stream aborted with INVALID_ARGUMENT: the seq
# of the batch that was refused, so the agent drops that batch and resends the rest.
REJECTED_SEQ_KEY = "gpuscope-rejected-seq"
