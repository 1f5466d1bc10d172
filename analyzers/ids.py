"""Ids of the records the analyzer makes: findings, anomalies, decisions.

80 random bits, as 20 hex digits. They were 48 (uuid4().hex[:12]), and a
store holding 14 days of a 2,000-agent fleet holds ~4e8 findings: about
270 pairs of them would have shared an id, and each collision replaced an
older row without a word (rows are upserted by id). With 80 bits the chance
of a single collision in such a store is below one in a million, so a record
the analyzer has just made is inserted as new, which costs DuckDB a fifth of
an upsert. The CLI takes any unique prefix of 4 digits or more."""
import os

ID_HEX_DIGITS = 20


def new_id() -> str:
    return os.urandom(ID_HEX_DIGITS // 2).hex()
