"""Who is calling: set by the server's authentication wrapper for the
duration of one call, read by servicers that must check a caller's host
(an agent may only act for its own host) or role (command lines only for
operators). A context variable, so it follows each call's task or thread."""
from __future__ import annotations

import contextvars

# Holds a security.auth.Caller, or None on an insecure server (loopback, --insecure).
CALLER: contextvars.ContextVar = contextvars.ContextVar("gpuscope_caller", default=None)


def current_caller():
    return CALLER.get()
