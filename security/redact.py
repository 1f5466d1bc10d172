"""Redaction of secrets in command lines before anything stores or shows them.

Jobs are launched with their credentials on the command line
(`--hf-token=...`, `WANDB_API_KEY=... python train.py`,
`git clone https://user:pass@host/...`), and the command line travels from
/proc to the analyzer's store, findings, events and the on-call's terminal.
What is removed here is gone everywhere downstream.

A name counts as a secret's when one of its words (split at `-`, `_`, `.`
and camelCase's capitals)
is a secret word: token, key, secret, password, passwd, credential(s),
creds, pat (a personal access token), auth, oauth, private, jwt, cookie, sig,
signature, their plurals (`--api-keys`, `--tokens`), a word ending in
token/secret/password/passwd/passphrase/pwd/credential/cookie/signature/key
(`HFTOKEN`, `PGPASSWORD`, `MYSQL_PWD`, `-setcookie`, Azure's `AccountKey=`,
Tailscale's `--authkey`, `--hmackey`, `--licensekey`; not an English word
such as `--monkey` or `--hotkey`, nor a data word's `--sortkey`), or pass or
pw as its last word (`--db-pass`, not `--pass-through`; keytool's
`-storepass`, `-keypass`).
Whole words only, so the ML flags that merely mention tokens keep their
values: `--tokenizer gpt2`, `--keyboard`, `--author`. Its other words may say the value is something else, and then
it stays: a last word naming a number, a kind, or where or which the secret
is (`--key-frames 10`, `--sig-figs 3`, `--auth-type basic`,
`--auth-provider oidc`, `--token-source env`, `--password-stdin`,
`--token-file f`, `--secret-name n`, `--private-ip 10.0.0.1`,
`--secret-namespace ns`, whose: `auth.username=bob`, what it may do: `--oauth-scopes repo`), a quantity word anywhere
(`--max-num-batched-tokens 8192`, `--num-key-value-heads 8`,
`--tokens-per-sample 512`), a word before `key` that makes it a field of
data (`--sort-key name`, `--json-keys text`, `--public-key`, a dataset's
column: `--csv-caption-key title`, `--chosen-key`; JAX's `--rng-key 0`) or
a mapping (`--key-value-cache fp8`), or one before
`token` that makes it a model's (`--pad-token-id 0`, `--eos-token '</s>'`,
`--output-tokens-mean 256`). A switch's `true`/`false`/`none` stays
(`--use_auth_token True`, `--auth none`). A file's place stays (`--ssh-key
~/.ssh/id_rsa`, `--tls-key /etc/tls/key.pem`; `~/`, `./`, `../`, or absolute
with a `.` or in lower case, which no key's encoding writes: `--secret-key
/K7MDENG/bPx...` goes; or a file's name with a key's, a certificate's or a
config's extension: `--key=a.key`, `--cert=a.pem`, `--credentials c.json`),
but not a password's (`--password ./x`: a person chose it); `pwd` is also
the working directory's name, so a path after it is a place (`--pwd
/home/x`, `OLDPWD=/home/x`). A spec of `name=value` fields stays but for
the fields whose own name is a secret's (`docker build --secret
id=npm,src=/npmrc`; `--secret id=x,password=<redacted>`). A JSON or Python literal's or a subscript's secret-named key has its value
go (`{"hf_token": "abc"}`, `os.environ["HF_TOKEN"]="abc"`). A JSON or Python
literal's bare `"key"` holding a short
lower-case word names a field (vLLM's `--hf-overrides '{"key": "value"}'`).
A number stays where only a count or an index can be one: for a
plural `tokens` or `keys` (Megatron's `--train-tokens 300000000000`,
`--lr-decay-tokens 2.6e11`, `--kv-keys 8`) and for a token's or key's id
(`--token-ids 1,2,3`), since programs make tokens and keys and never make
them a bare number; not for a password's words (`--password 1234` is a PIN),
nor for a singular token (`--token 123456`, `--token-code 123456` are MFA
codes). When in doubt we redact: a name these words do not explain
(`--key-id abc`, `--token-code 123456`, `--tokens t1`) keeps its value
hidden, since a lost number costs less than a leaked token.

A short flag means what its program says (`-p` is mysql's password, ssh's
port), so one is read only after a program known to take a password there,
among that program's words: mysql's and mariadb's tools' `-pPASSWORD`
(glued: `-p db` asks, then names a database), a `login` subcommand's `-p`
(`docker login`, `oc login`, `az login`), curl's `-u`/`-U user:password`
(its name stays) and `-b name=value` cookies, sshpass's `-p`, redis-cli's
`-a`, the mongo tools' `-p`, the ldap tools' `-w`, sqlcmd's and bcp's `-P`,
smbclient's `-U user%password`, openssl's `pass:PASSWORD`, ssh-keygen's
`-N`/`-P`, 7z's and rar's `-pPASSWORD`, zip's `-P`, Oracle's
`user/password@db` (sqlplus), lftp's `-u user,password`, twine's `-p`, and
the token `vault login` and the key `wandb login` take. Elsewhere
short flags keep their values (`-p 8080`, `docker run -u 1000:1000`).

A setting's name and its value as words of their own go as a flag's do,
after `config set`, `configure set` or `git config` and its scope (`aws
configure set aws_secret_access_key <redacted>`, `git config --global
user.password <redacted>`, `npm config set //registry.npmjs.org/:_authToken
<redacted>`; `git config credential.helper store` stays).

A secret-named value that is an Authorization scheme keeps it, and the
credential after it goes (`--auth-token=Bearer <redacted>`, as /proc shows a
quoted `"Bearer abc"`).

Tokens of a recognisable issuer's format (`hf_...`, `ghp_...`, `sk-...`,
`AKIA...`, `AIza...`, PyPI's `pypi-AgE...`, npm's `npm_...`, Vault's
`hvs....`, Tailscale's `tskey-...`, JWTs' `eyJ....eyJ....sig`) go wherever
they stand, as does the credential of any Authorization header and any
Cookie header's cookies.

A value ends at the next blank, or with its quotes when quoted
(`--password 'two words'`); one that a blank follows right after its `=` is
empty and stays so (`--api-key= --port 8000`, `HF_TOKEN= python x.py`: an
unset variable's, as the program reads it), though a header's `:` may have
a blank after it (`X-Api-Key: abc`); one inside a query or a connection string
(`?sv=1&sig=abc&se=2`, `;AccountKey=abc;EndpointSuffix=x`) or a comma's
list of fields (`--export=ALL,HF_TOKEN=abc,WANDB_MODE=offline`, Helm's
`--set auth.password=abc,auth.username=bob`) ends at the next field, which
stays.

A URL's user name stays (it says who), its password goes, up to the last
`@` before the host (`https://user:p@ss@host`, as URL parsers read it),
whatever the user's name (`https://x-access-token:<redacted>@github.com/o/r`:
no pattern takes a URL's host or path with its password). A
URL with a user name and no password (`https://ghp_x@github.com`) is left
as it is: the name alone is usually a login (`git@`), and guessing which
are tokens would be wrong both ways.

A webhook's or a bot's URL that holds its key goes wherever it stands:
Slack's (`https://hooks.slack.com/services/T../B../<redacted>`), Discord's
(`/api/webhooks/<id>/<redacted>`) and Telegram's bot token
(`https://api.telegram.org/bot123:<redacted>/sendMessage`).

A URL that is logged (an alert receiver's) is shown by `redact_url`, which
is stricter: webhooks carry their key in the user info, the query or a
path segment (Slack's `/services/T../B../<key>`), so all user info, every
query value and every long path segment of letters and digits go. So is a
URL on a command line whose name says it is a webhook's or a DSN's
(`--slack-webhook https://hooks.slack.com/services/T../B../<redacted>`,
`--sentry-dsn https://<redacted>@o1.ingest.sentry.io/1`: a DSN's user is
its key).

Pure functions, standard library only, so both halves may import this.
"""
from __future__ import annotations

import re
import urllib.parse

from gpuscope.collectors.records import POD_JOB_PREFIX

REDACTED = "<redacted>"

_WORD = r"[a-z0-9]+"
# A word ending in `key` is a key's, whatever is glued before it (`apikey`, `authkey` as Tailscale's
# `--authkey`, `hmackey`, `sessionkey`, camelCase's `encryptionKey`), unless _glued_key says it is an English
# word (`monkey`, `hotkey`) or a data word's (`sortkey`); `creds` and `pat` (a personal access token) only
# whole (not `sacred`, `compat`).
_SECRET_WORD = (r"(?:[a-z0-9]*(?:token|secret|password|passwd|passphrase|pwd|credentials?|cookie|signature|keys?)"
                r"|(?:tokens|secrets|passwords|passphrases|cookies|signatures)"
                r"|auth|oauth2?|private|jwt|sig|creds?|pat)")
# Short words that name a password only as a name's last word (`--db-pass`, `--pw`), not `--pass-through`
# or `--pw-length` (found in a trial: a torchrun script name redacted after --pass-through); Java's
# keytool and jarsigner write theirs as one word (`-storepass`, `-srckeypass`)
_LAST_WORD = r"(?:(?:src|dest)?(?:store|key)?pass|pw|[a-z0-9]*[a-z0-9](?-i:Pass|Pw))"     # and `dbPass`
# A name with a secret word in it, whole words only (the next character after
# the secret word is a separator or the end of the name); _names_a_secret has the last word.
# The lookahead finds the secret word, then the name is taken whole and never given back: a name of
# many words is read once (found in a trial: `--key-key-...-key x`, 4 KB, took 160 ms as each `key`
# was tried with the rest of the name after it).
_NAME = (rf"(?=(?:{_WORD}[-_.])*(?:{_SECRET_WORD}(?![a-z0-9])|{_LAST_WORD}(?![-_.\w])))"
         rf"{_WORD}(?:[-_.]{_WORD})*+")
# A name's last word that says its value is not the secret but a number, a kind, or where or which
# the secret is (`--key-frames 10`, `--auth-type basic`, `--password-stdin`, `--token-file f`).
_NOT_THE_SECRET = frozenset((
    "size", "len", "length", "limit", "threshold", "budget", "bits", "ttl", "timeout", "interval",
    "retries", "heads", "frames", "dim", "dims", "layers", "mean", "stddev", "rate", "ratio", "fraction",
    "factor", "scale", "weight", "penalty", "dropout", "figs", "digits",
    "type", "kind", "mode", "format", "algorithm", "method", "scheme", "version", "provider", "source", "backend",
    "file", "path", "dir", "jar", "stdin", "fd", "env", "url", "uri", "endpoint", "host", "port", "name", "prefix",
    # where a secret lives or whom it is for, never the secret (`--private-ip`, `--secret-namespace ns`)
    "ip", "addr", "address", "subnet", "cidr", "network", "domain", "namespace", "region", "zone", "bucket",
    "server", "store", "registry",
    # whose it is, and the program that fetches it (`auth.username=bob`, git's `credential.helper store`)
    "user", "username", "email", "helper",
    # what it may do (`--oauth-scopes repo`, `--token-scopes read`)
    "scope", "scopes"))
# A word anywhere in a name that makes its value a number: `--max-num-batched-tokens`,
# `--num-key-value-heads`, `--tokens-per-sample` (a plural is as much a count as a secret's list).
_QUANTITY = frozenset(("max", "min", "num", "n", "number", "total", "count", "per"))
# Words before `key` that make it a field of data, not a secret: `--sort-key`, `--json-keys text`; a
# dataset's columns by what they hold (open_clip's `--csv-img-key filepath --csv-caption-key title`, a
# preference set's `--chosen-key`, `--rejected-key`); a random generator's key (JAX's `--rng-key 0`). Not
# words that also name whose key it is (`user`: 3scale's `user_key` is its API key; `content`, a
# content-encryption key; `obs`, Huawei's object store; `box`, `chat`, `system`).
_DATA_KEY = frozenset((
    "sort", "group", "partition", "primary", "foreign", "public", "shard", "routing", "cache", "dict", "lookup",
    "join", "index", "label", "metric", "column", "field", "json", "text", "input", "output", "image", "prompt",
    "response", "data", "dataset", "target", "feature",
    "id", "img", "caption", "audio", "video", "speech", "frame", "pixel", "mask", "bbox", "class",
    "category", "tag", "title", "context", "document", "doc", "passage", "query", "question",
    "answer", "instruction", "conversation", "conversations", "message", "messages", "assistant", "completion",
    "chosen", "rejected", "reward", "score", "preference", "summary", "transcript",
    "sentence", "language", "lang", "filename", "filepath", "timestamp", "time", "state", "action",
    "observation", "embedding", "latent", "condition", "neg", "pos", "negative", "positive",
    "rng", "prng", "seed", "random"))
# English words that end in `key` and name no key (`--monkey`, `--hotkey`): a glued `...key` is otherwise
# a secret's, since flags glue the key's kind to it (`--authkey`, `--hmackey`, `--licensekey`, `--aeskey`)
_NOT_A_KEY = frozenset(("monkey", "donkey", "turkey", "hockey", "jockey", "whiskey", "lackey", "flunkey", "malarkey",
                        "hotkey", "turnkey"))
# `key` before `value`: a mapping, not a secret (`--key-value-cache fp8`, `--key-value-store redis`)
_MAPPING = frozenset(("value", "values", "val", "vals"))
# Words before `token` that make it a piece of text, a model's: `--pad-token-id 0`, `--eos-token '</s>'`,
# `--stop-token-ids`, `--output-tokens-mean 256`, `--speculative-token-map f`.
_TEXT_TOKEN = frozenset((
    "pad", "eos", "bos", "unk", "sep", "mask", "cls", "eot", "special", "stop", "start", "end", "input", "output",
    "prompt", "image", "audio", "video", "vision", "new", "draft", "speculative", "prefill", "decode",
    "generated", "extra", "added", "vocab", "chat", "system", "reasoning"))
# A switch's value says whether, not what (`--use_auth_token True`, HF's examples; `--auth none`).
_BOOLEAN = frozenset(("true", "false", "none", "null"))
# Numbers as programs read them, one or a list: 300000000000, 3e11, 2.5e-3, 1_000, 1,2,3
_NUMBERS = re.compile(r"[+-]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?(?:,[+-]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)*",
                      re.IGNORECASE | re.ASCII)
_TOKEN_OR_KEY = frozenset(("token", "tokens", "key", "keys"))
# A file's place, not its contents: `~/`, `./`, `../`, or an absolute path that no key's encoding can
# write: one with a `.` (base64, base64url and hex have none: `/etc/tls/key.pem`), or of lower-case
# segments (`/run/secrets/hf`; 1 in 64 base64 keys starts with `/`, as AWS's secret keys may, and a
# long one has capitals). `/K7MDENG/bPxRfiCY` stays a key.
_PATH = re.compile(r"(?:~|\.\.?)/\S*|/\S*\.\S*|/[a-z0-9_-]+(?:/[a-z0-9_-]*)+", re.ASCII)
# A file's name with a key's, a certificate's or a config's extension is a path too, where it stands
# (`kubectl create secret tls x --cert=a.pem --key=a.key`, found by a tester; `--credentials creds.json`):
# no key's encoding writes a `.`
_FILE = re.compile(r"(?:[\w.-]+/)*[\w.-]*\w\.(?:key|pem|crt|cer|der|csr|p12|pfx|jks|keystore|p8|ppk|pub|asc|gpg"
                   r"|json|ya?ml|toml|ini|conf|cfg|env|txt)", re.IGNORECASE | re.ASCII)
# A password's words: a person chose it, so it may look like anything, a path too; not `pwd`, which is
# also the working directory's name (`--pwd /home/x`, `PWD=/home/x`, `OLDPWD=`: a place, found by a tester)
_PASSWORD_WORD = re.compile(r"[a-z0-9]*(?:pass(?:word|wd|phrase)?|pw)s?", re.ASCII)
# A spec of `name=value` fields (`docker build --secret id=npm,src=/npmrc`, found by a tester): its fields
# say what each is, so only those whose own name is a secret's go (their pattern reads them)
_SPEC = re.compile(r"[a-z][a-z0-9_.-]*=[^\s=,]+(?:,[a-z][a-z0-9_.-]*=[^\s=,]+)*", re.ASCII)
# Quoted values whole (a shell string) with what is glued to them (`'abc'def` is one word to a shell),
# else up to the next blank.
_VALUE = r"""(?:(?:"[^"]*"|'[^']*')[^\s"']*|\S+)"""
# A value after `=` ends, too, where a list of `name=value` fields goes on (Slurm's `--export=ALL,HF_TOKEN=abc,
# WANDB_MODE=offline`, Helm's `--set auth.password=abc,auth.username=bob`: found by a tester, the fields after
# the secret were lost); the lookahead looks only at commas, so a long value is still read once.
_LISTED = r"(?:(?!,[a-z_][\w.-]*=)[^\s\"'])"
_LISTED_VALUE = rf"""(?:(?:"[^"]*"|'[^']*'){_LISTED}*|(?:(?!,[a-z_][\w.-]*=)\S)+)"""
# Not inside another name: the `--token` of `x--token=abc` is not a flag.
_START = r"(?<![\w.-])"

_FLAGS = re.IGNORECASE | re.ASCII     # names are ASCII; no KELVIN SIGN matching `k`
# Blanks, including those /proc shows for odd bytes (NUL, DEL, NBSP, zero
# width, U+FFFD once cleaned): a separator an attacker of our redaction may pick.
_BLANKS = "\\s\x00\x7f\u00a0\u2000-\u200b\u3000\ufeff\ufffd"
_SEP = f"[{_BLANKS}]"
# A field of a query or a connection string (`?sig=abc&se=1`, `;AccountKey=abc;EndpointSuffix=x`): its
# value ends at the next field, which _ASSIGNED would take as part of it.
_FIELD = re.compile(rf"""(?<=[?&;#])((?P<name>{_NAME})=)(?:(?:"[^"]*"|'[^']*')[^\s&;#"']*|[^\s&;#"']+)""", _FLAGS)
# --hf-token=abc, --hf-token: abc, -Dssl.keyStorePassword=abc, HF_TOKEN=abc; not a URL's
# user info (`https://x-access-token:abc@github.com/o/r`, found by a tester: the value ran on over the
# host and path), which _USERINFO reads up to its `@`. A blank after `=` ends the value: it is empty, as
# the program and the shell read it (found by a tester: an unset `--api-key=$VLLM_API_KEY` took the next
# flag, `--api-key= --port 8000`, and `HF_TOKEN= python x.py` the program's name); a header's `:` may
# have one (`X-Api-Key: abc`).
_ASSIGNED = re.compile(rf"(?<![\w.?&;#-])(?<!//)(-{{0,2}}(?P<name>{_NAME}){_SEP}*(?:[=\uff1d]|[:\uff1a]{_SEP}*)){_LISTED_VALUE}",
                       _FLAGS)
# A secret-named value that is an Authorization scheme, then the credential as a word of its own, as /proc
# shows `--auth-token="Bearer abc"` (found by a tester: the scheme went and the credential stayed); before
# _ASSIGNED and _SPACED, which leave such a scheme to it
_SCHEMES = ("bearer", "basic")
_SCHEMED = re.compile(rf"""(?<![\w.?&;#-])(?<!//)(-{{0,2}}(?P<name>{_NAME})["']?"""
                      rf"""(?:{_SEP}*(?:[=\uff1d]|[:\uff1a]{_SEP}*)|{_SEP}+)["']?(?:{"|".join(_SCHEMES)}){_SEP}+)"""
                      rf"""(?!-){_VALUE}""", _FLAGS)
_REDACTED_NEXT = re.compile(rf"{_SEP}+{re.escape(REDACTED)}")
# --hf-token abc, -token abc (Go's flags), '--hf-token' 'abc' (a script's); a following long flag is not
# a value, a value that starts with one dash is redacted (when in doubt we redact).
_SPACED = re.compile(rf"""{_START}(-{{1,2}}(?P<name>{_NAME})["']?{_SEP}+)(?!--){_VALUE}""", _FLAGS)
# JSON or Python literals: {"hf_token": "abc"}, {'api_key': abc}, and a subscript's assignment (found by a
# tester: `python -c 'os.environ["HF_TOKEN"]="abc"; main()'`) or comparison (`== "abc"`)
_KEYED = re.compile(rf"""(["'](?P<name>{_NAME})["']\]?{_SEP}*(?:==|[:=]){_SEP}*)(?:"[^"]*"|'[^']*'|[^\s,;}}\]]+)""", _FLAGS)
# https://user:pass@host; the user info ends at the authority's last '@' (found by a tester:
# https://user:p@ss@host showed `ss`), so the password may hold ':' and '@' but never '/', '?', '#' or blanks.
_USERINFO = re.compile(r"(://[^\s/:?#]*:)[^\s/?#]+(?=@[^\s/?#@]*(?:[\s/?#]|$))")
# Cookies: `name=value` pairs joined by `;`, a blank after it in one argument (`-H Cookie: a=1; b=2`
# from /proc, which has no quotes to end the header)
# A literal's bare "key" names a field when its value is a field's name (`--hf-overrides '{"key": "value"}'`,
# `[{"key": "text", ...}]`): a quoted word of lower-case letters, which no key's encoding writes this short
_FIELD_NAME = re.compile(r"""(["'])[a-z][a-z_.-]{0,31}\1""", re.ASCII)
_COOKIES = r"""(?:"[^"]*"|'[^']*'|(?:[^\s;"']+;[\s\x00]*)*[^\s;"']+;?)"""
# curl -H 'Cookie: session=abc; id=2', Set-Cookie: (found by a tester); before _ASSIGNED and _FIELD,
# which would end the value at the first blank or `;`
_COOKIE_HEADER = re.compile(rf"(\bcookie{_SEP}*:{_SEP}*){_COOKIES}", _FLAGS)
# curl -H "Authorization: Bearer abc"
_BEARER = re.compile(r"(\bbearer\s+)[\w.~+/=-]+", _FLAGS)
# any other scheme of an Authorization header: "Authorization: token abc", "AUTHORIZATION: basic abcd"
_AUTH_HEADER = re.compile(r"(\bauthorization\s*:\s*(?:(?:basic|token|digest)\s+)?)(?!bearer\b)[^\s\"']+", _FLAGS)
# tokens whose issuers made them recognisable, wherever they stand (`huggingface-cli login hf_...`):
# Hugging Face, GitHub, GitLab, OpenAI-style, Slack, an AWS access key id, Google's API keys; PyPI's
# (macaroons, `pypi-AgE...`), npm's, HashiCorp Vault's (service, batch and recovery tokens; the older
# `s.` ones only after `vault login`, as `s.` starts ordinary words), Tailscale's, and JWTs: three base64url
# parts, the first two JSON objects (`eyJ` is `{"`), the signature possibly empty (`alg: none`)
_ISSUED = re.compile(r"()(?<![\w-])(?:hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_\w{30,}"
                     r"|glpat-[\w-]{20,}|sk-[\w-]{20,}|xox[abposr]-[\w-]{10,}|A[KS]IA[0-9A-Z]{16}"
                     r"|AIza[\w-]{35}|pypi-[\w-]{50,}|npm_[A-Za-z0-9]{36}|hv[sbr]\.[\w-]{20,}|tskey-[\w-]{8,}"
                     r"|eyJ[\w-]+\.eyJ[\w-]+\.[\w-]*)(?![\w-])", re.ASCII)
# A webhook's or a DSN's URL, named so (`--slack-webhook https://hooks.slack.com/services/T../B../<key>`,
# `SENTRY_DSN=https://<key>@o1.ingest.sentry.io/1`): its key is in the path or the user info, where a URL
# has no password, so it is shown as redact_url shows a logged one
_HOOK_NAME = (rf"(?=(?:{_WORD}[-_.])*[a-z0-9]*(?:webhook|dsn)s?(?![a-z0-9]))"
              rf"{_WORD}(?:[-_.]{_WORD})*+")
_HOOKED = re.compile(rf"""{_START}(-{{0,2}}{_HOOK_NAME}["']?(?:{_SEP}*[=:]{_SEP}*|{_SEP}+)["']?)"""
                     r"""([a-z][a-z0-9+.-]*://[^\s"']+)""", _FLAGS)
# A setting's name, then its value, as words of their own (found by a tester: `aws configure set
# aws_secret_access_key X`, `git config --global user.password X`, `npm config set //registry.npmjs.org/:_authToken
# X` kept theirs): after `config set`, `configure set` or `git config` and its scope, the name is read as a
# flag's (its last part after a `/` or `:`), and the next word is its value.
_CONFIG_SET = re.compile(
    rf"""(?<![\w.-])((?:(?:config|configure){_SEP}+set|git(?:{_SEP}+-c{_SEP}+\S+)*{_SEP}+config"""
    rf"""(?:{_SEP}+--(?:global|system|local|worktree|add|replace-all|file(?:=|{_SEP}+)\S+))*)"""
    rf"""{_SEP}+(?:[^\s=]*[/:])?_*(?P<name>{_WORD}(?:[-_.]{_WORD})*+){_SEP}+)(?!-){_VALUE}""", _FLAGS)
# Webhooks and bots whose URL holds their key wherever it stands (found by a tester: a bare `curl` to one
# kept it): Slack's last path segment (`hooks.slack.com/services/T../B../<key>`, its workflows' and
# triggers'), Discord's (`/api/webhooks/<id>/<token>`) and Telegram's bot token (`/bot<id>:<token>/`)
_HOOK_URL = re.compile(r"""((?:hooks\.slack\.com/(?:services|workflows|triggers)/(?:[^\s/?#"']+/)+"""
                       r"""|discord(?:app)?\.com/api/webhooks/[^\s/?#"']+/|api\.telegram\.org/(?:file/)?bot[^\s/?#"':]+:))"""
                       r"""[^\s/?#"']+""", re.IGNORECASE | re.ASCII)
_PATTERNS = (_COOKIE_HEADER, _KEYED, _FIELD, _SCHEMED, _ASSIGNED, _SPACED, _CONFIG_SET, _USERINFO, _HOOK_URL, _BEARER, _AUTH_HEADER,
             _ISSUED)

# A short option means what its program says: `-p` is mysql's password but ssh's port, `-u` curl's
# user:password but docker's uid:gid. So a short option's value goes only after a program known to take
# a password there, and only among that program's words.
_OPTION = rf"""(?<![^{_BLANKS}"'])"""     # an option starts a word, or a script's quoted string
# A program's words run to the end of its command in a script: a line's end, `&&`, `||`, or a `|` or `;`
# and a blank before a word that is no `name=value`. /proc's lines have no shell, and their `&`, `;` and `|`
# are arguments' (`-b a=1; b=2`, a URL's query), so a command ends late rather than early: the next
# command's short options may lose a value, the program's never keep one.
_ARGS = r"(?:(?!\n|&&|\|\||[|;]\s+(?![^\s=]+=))[\s\S])*"
_ORACLE_LOGIN = r"""((?:userid=)?[^\s/@"'=-][^\s/@"'=]*/)[^\s@"']+"""
_PROGRAM_OPTIONS = (
    # clue, the program's names, its own words, its options that carry a password (group 1 stays)
    # mysql, mariadb and their tools (mysqldump, mariadb-admin): glued, `-pPASSWORD`; `-p db` asks
    # for the password, then names a database
    ("mysql", r"mysql[\w-]*", _ARGS, (rf"(-p)(?=\S){_VALUE}",)),
    ("mariadb", r"mariadb[\w-]*", _ARGS, (rf"(-p)(?=\S){_VALUE}",)),
    # a `login` subcommand (docker, podman, helm registry, nerdctl, oc, az, cf login): `-p PASSWORD`;
    # not the login program (`login -p` keeps the environment)
    ("login", r"(?<=[\w.-]\s)login", _ARGS, (rf"(-p(?:{_SEP}+|=)?)(?!--){_VALUE}",)),
    # curl's user:password (-u) and its proxy's (-U): the name stays, as in a URL; its cookies
    # (`-b name=value`; without `=` it names a file)
    ("curl", "curl", _ARGS, (
        rf"""((?:-[uU]{_SEP}*|--(?:proxy-)?user(?:{_SEP}+|=))(?:(?P<dq>")|(?P<sq>'))?[^\s:'"]*:)"""
        r"""(?(dq)[^"]*|(?(sq)[^']*|\S+))""",
        rf"""(-b{_SEP}*|--cookie(?:{_SEP}+|=))(?=["']?[^\s;"']*=){_COOKIES}""")),
    # sshpass's own options, before the command it runs (whose `-p` is ssh's port)
    ("sshpass", "sshpass", rf"(?:{_SEP}+(?:-[pfdP]{_SEP}*\S+|-\S+))*", (rf"(-p{_SEP}*){_VALUE}",)),
    ("redis-", r"redis-(?:cli|benchmark)", _ARGS, (rf"(-a{_SEP}*)(?!--){_VALUE}",)),
    ("mongo", r"mongo(?:sh|dump|restore|export|import|stat|top|files)?", _ARGS,
     (rf"(-p(?:{_SEP}+|=)?)(?!--){_VALUE}",)),
    ("ldap", r"ldap(?:search|add|modify|delete|modrdn|compare|whoami|passwd|exop|url)", _ARGS,
     (rf"(-w{_SEP}*){_VALUE}",)),
    # Microsoft SQL Server's tools: `-P PASSWORD`
    ("sqlcmd", "sqlcmd", _ARGS, (rf"(-P{_SEP}*){_VALUE}",)),
    ("bcp", "bcp", _ARGS, (rf"(-P{_SEP}*){_VALUE}",)),
    # Samba's user%password
    ("smb", r"smbclient|smbcacls|smbget", _ARGS,
     (rf"""((?:-U{_SEP}*|--user(?:name)?(?:{_SEP}+|=))[^\s%"']*%){_VALUE}""",)),
    # openssl's password sources (`-passin pass:PASSWORD`; `env:`, `file:` name where it is) and keys
    ("openssl", "openssl", _ARGS,
     (rf"(-pass(?:in|out)?{_SEP}+pass:){_VALUE}", rf"(-(?:k|K|hmac){_SEP}+){_VALUE}")),
    # ssh-keygen's new and old passphrases
    ("ssh-keygen", "ssh-keygen", _ARGS, (rf"(-[NP]{_SEP}*){_VALUE}",)),
    # archives: 7-Zip's and rar's glued `-pPASSWORD`, zip's `-P PASSWORD`
    ("7z", "7z[arz]?", _ARGS, (rf"(-p)(?=\S){_VALUE}",)),
    ("rar", "un?rar", _ARGS, (rf"(-p)(?=\S){_VALUE}",)),
    ("zip", "(?:un)?zip", _ARGS, (rf"(-P{_SEP}*){_VALUE}",)),
    # Oracle's user/password[@db], alone or as userid= (`sqlplus scott/tiger@orcl`; `/nolog`, `@script` stay)
    ("sql", "sqlplus|sqlldr", _ARGS, (_ORACLE_LOGIN,)),
    ("pdp", "expdp|impdp", _ARGS, (_ORACLE_LOGIN,)),
    # lftp's user,password (`-u user,pw`, `open -u user,pw` in its -c script): the name stays, as in a URL
    ("lftp", "lftp", _ARGS, (
        rf"""((?:-u{_SEP}*|--user(?:{_SEP}+|=))(?:(?P<dq>")|(?P<sq>'))?[^\s,'"]*,)"""
        r"""(?(dq)[^"]*|(?(sq)[^']*|\S+))""",)),
    # twine's password (`-p pypi-...`, PyPI's token)
    ("twine", "twine", _ARGS, (rf"(-p(?:{_SEP}+|=)?)(?!--){_VALUE}",)),
    # Vault's token, login's argument (`vault login s.abc`, `-method=token`); not `-` (stdin) nor the
    # `name=value` pairs of another method (`username=me`; a `password=` goes by its name)
    ("vault", "vault", _ARGS, (rf"(login(?:{_SEP}+-[\w-]+(?:=\S+)?)*{_SEP}+)(?!-)(?![^\s=]+=){_VALUE}",)),
    # wandb's API key, login's argument (`wandb login --relogin KEY`)
    ("wandb", "wandb", _ARGS, (rf"(login(?:{_SEP}+(?:--host(?:{_SEP}+|=)\S+|-[\w-]+))*{_SEP}+)(?!-){_VALUE}",)),
)
# each program with one of its options: (clue, program, option)
_BY_PROGRAM = tuple(
    (clue, re.compile(rf"""(?<![\w.-])(?:{names})(?=[{_BLANKS}"']|$)(?P<args>{args})""", re.IGNORECASE),
     re.compile(_OPTION + option, re.ASCII))
    for clue, names, args, options in _PROGRAM_OPTIONS for option in options)

# Every pattern needs one of these (lower case): most command lines have
# none, and str.find is ~50x cheaper than running the patterns.
_CLUES = ("token", "key", "secret", "pass", "pw", "cred", "auth", "private", "://", "bearer",
          "cookie", "jwt", "sig", "webhook", "dsn", "hooks.slack", "api.telegram",
          "hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "sk-", "xox", "akia", "asia", "aiza",
          "pypi-", "npm_", "hvs.", "hvb.", "hvr.", "tskey-", "eyj",
          *{clue for clue, _, _, _ in _PROGRAM_OPTIONS})

# `pat` as a word (`--pat`, `GH_PAT=`), not inside `path`, which most command lines hold
_PAT_CLUE = re.compile(r"(?<![a-z0-9])pat(?![a-z0-9])")

# A distributed job as its launcher names it (collectors/ranks.py), alone or as a straggler's
# "<job> rank <n>": the launcher's own words, which readers see in each rank's attribution anyway
DIST_JOB_PREFIXES = ("slurm:", "mpi:", "torch:", "jax:", "lws:", "jobset:", "k8s:")


def command_label(job: str) -> str:
    """What a reader (not an operator) is shown of a job: its pid and
    executable, `pid:123 /usr/bin/python3 train.py --lr 3e-4` -> `pid:123 python3`."""
    if job.startswith(POD_JOB_PREFIX):  # a GPU its source names the pod of: no command line in it
        return job
    if job.startswith(DIST_JOB_PREFIXES):  # no command line in it either
        return job
    head, _, rest = job.partition(" ")
    if not head.startswith("pid:"):
        head, rest = "", job
    exe = rest.split(" ", 1)[0].rsplit("/", 1)[-1] if rest else ""
    return " ".join(p for p in (head, exe) if p)


def redact_command(cmdline: str) -> str:
    """The command line with the values of secret-named flags and variables,
    URL passwords, Authorization and Cookie headers' credentials, issuers'
    tokens and the passwords programs take in short options replaced by
    `<redacted>` (the module's doc has the rules)."""
    lower = cmdline.lower()
    if not any(clue in lower for clue in _CLUES) and not _PAT_CLUE.search(lower):
        return cmdline
    # programs' own options first, read as the program reads them (mysql's `-password x` is `-p assword`)
    for clue, program, option in _BY_PROGRAM:
        if clue in lower:
            cmdline = program.sub(lambda p: _options(p, option), cmdline)
    if "webhook" in lower or "dsn" in lower:
        cmdline = _HOOKED.sub(_hook, cmdline)
    for pattern in _PATTERNS:
        cmdline = pattern.sub(_redacted, cmdline)
    return cmdline


def _hook(m: re.Match) -> str:
    """A webhook's or a DSN's URL as a log shows it: where it goes, not its key."""
    try:
        return m.group(1) + redact_url(m.group(2))
    except ValueError:      # not a URL urllib can read (`http://[x`): all of it goes
        return m.group(1) + REDACTED


def _options(program: re.Match, option: re.Pattern) -> str:
    """A program's name and its words, with its option's values redacted; the option's matches see the
    whole command line around them (the quote a script's string opened before the program)."""
    text, at, end = program.string, program.start("args"), program.end()
    pieces = [text[program.start():at]]
    for m in option.finditer(text, at, end):
        pieces += [text[at:m.start()], _redacted(m)]
        at = m.end()
    return "".join(pieces) + text[at:end]


def _redacted(m: re.Match) -> str:
    """A match with its value (what follows group 1) redacted, unless its name says the value is no secret."""
    name = m.groupdict().get("name")
    value = m.group(0)[len(m.group(1)):]
    if name is not None and not _names_a_secret(name, value.strip("\"'")):
        return m.group(0)
    if m.re is _KEYED and name.lower() == "key" and _FIELD_NAME.fullmatch(value):
        return m.group(0)
    if value.lower() in _SCHEMES and _REDACTED_NEXT.match(m.string, m.end()):     # _SCHEMED's: the scheme stays
        return m.group(0)
    return m.group(1) + REDACTED + _closing_quote(m)


def _closing_quote(m: re.Match) -> str:
    """The quote an unquoted value ends with when it closes a shell string opened before the value
    (`bash -c "x --token=abc"`, `"--hf-token=abc"`): the script's, so it stays. A quote that closes
    nothing is the secret's own and goes with it."""
    value = m.string[m.end(1):m.end()]
    quote = value[-1:]
    if quote in ("'", '"') and value[0] != quote and m.string.count(quote, 0, m.end(1)) % 2:
        return quote
    return ""


_SECRET_WORD_RE = re.compile(_SECRET_WORD, _FLAGS)
# camelCase and PascalCase words split at their capitals (keyStorePassword: key, store, password;
# SharedAccessKeyName: ..., name); a word of other cases (`Hf_ToKeN`, `HFTOKEN`) stays whole
_CAMEL_WORD = re.compile(r"[a-z][a-z0-9]*(?:[A-Z][a-z0-9]+)+|(?:[A-Z][a-z0-9]+){2,}")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_LAST_WORD_RE = re.compile(_LAST_WORD, _FLAGS)


def _names_a_secret(name: str, value: str) -> bool:
    """Whether a name the patterns found (it holds a secret word) is a secret's once all its words are read:
    the last word may say the value is something else, a quantity word makes it a number, and a word
    before `key` or `token` may make it a field of data or a piece of text. Some values say what they are
    whatever the name: a switch's, and a number where only a count or an index can be one."""
    words = [w.lower() for word in re.split(r"[-_.]", name)
             for w in (_CAMEL.split(word) if _CAMEL_WORD.fullmatch(word) else (word,))]
    if words[-1] in _NOT_THE_SECRET or not _QUANTITY.isdisjoint(words) or value.lower() in _BOOLEAN:
        return False
    secret = {w for i, w in enumerate(words)
              if (_SECRET_WORD_RE.fullmatch(w) or (i == len(words) - 1 and _LAST_WORD_RE.fullmatch(w)))
              and not (i and _explained(words[i - 1], w)) and not _glued_key(w)
              and not (w in ("key", "keys") and words[i + 1:i + 2] and words[i + 1] in _MAPPING)}
    if not secret:
        return False
    # A number for a plural `tokens` or `keys` is how many (`--train-tokens 3e11`, `--kv-keys 8`), and for a
    # token's or key's id which one (`--token-ids 1,2,3`): tokens and keys are made by programs, never a
    # bare number. Not for a password's words (`--password 1234` is a PIN) nor for a singular `--token
    # 123456` (an MFA code is a token of six digits).
    if _NUMBERS.fullmatch(value) and (secret <= {"tokens", "keys"}
                                      or (secret <= _TOKEN_OR_KEY and words[-1] in ("id", "ids"))):
        return False
    # A path is where a key or a token is kept (`--ssh-key ~/.ssh/id_rsa`, `--tls-key /etc/tls/key.pem`), never
    # their material, which programs encode without `~`, `.` or lower-case-only words; a password's may be one.
    if (_PATH.fullmatch(value) or _FILE.fullmatch(value)) and not any(_PASSWORD_WORD.fullmatch(w) for w in secret):
        return False
    # a spec of fields: each field's own name says whether it is a secret (`--secret id=npm,src=/npmrc`)
    if _SPEC.fullmatch(value):
        return False
    return True


def _explained(before: str, word: str) -> bool:
    """Whether the word before a secret word makes it no secret: a data field's key, a model's token."""
    return (word in ("key", "keys") and before in _DATA_KEY) or (word in ("token", "tokens") and before in _TEXT_TOKEN)


_GLUED_KEY = re.compile(r"([a-z0-9]+)keys?", re.ASCII)


def _glued_key(word: str) -> bool:
    """Whether a word with `key` glued to its end names no key: an English word (`monkey`, `hotkeys`) or a
    data word's key (`sortkey`, `rngkey`), as the same words before `-key` say."""
    m = _GLUED_KEY.fullmatch(word)
    return bool(m) and (word.removesuffix("s") in _NOT_A_KEY or m.group(1) in _DATA_KEY)


# A path segment as long as a key: 16 characters with a digit (GUIDs, most keys), or any 20 (Slack's
# 24-letter key may hold no digit). The words of an API's path (`api`, `v2`, `alerts`, `hooks`) are short;
# a long one redacted costs less than a key logged.
_KEY_SEGMENT = re.compile(r"(?=.*\d).{16,}|.{20,}")


def redact_url(url: str) -> str:
    """A URL fit for a log: where it goes (scheme, host, port, the path's
    words), without user info, query values, a fragment or key-like path
    segments."""
    u = urllib.parse.urlsplit(url)
    host = u.netloc.rpartition("@")[2]
    netloc = f"{REDACTED}@{host}" if "@" in u.netloc else host
    path = "/".join(REDACTED if _KEY_SEGMENT.fullmatch(seg) else seg for seg in u.path.split("/"))
    query = "&".join(f"{name}={REDACTED}" if sep else name
                     for name, sep, _ in (item.partition("=") for item in u.query.split("&") if item))
    return urllib.parse.urlunsplit((u.scheme, netloc, path, query, ""))
