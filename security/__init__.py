"""Security both halves share: TLS credentials, certificates for trials,
callers and roles, redaction of secrets. Imports grpc and cryptography only;
collectors, daemon and analyzers may import it, it imports none of them."""
