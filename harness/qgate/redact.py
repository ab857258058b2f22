"""Secrets kept out of everything qgate writes: results, verdicts, reports, stores and one-line errors.

Two kinds of secret reach qgate from its caller:

- environment variables it records (`inherited_env`: the shell's VLLM_*, HF_*, ... that can change
  what vLLM does). A variable whose name says it holds a secret (SECRET_NAME: a token, a key, a
  password, a secret, a credential, an auth value, a cookie, a private key) is recorded as REDACTED,
  never its value nor a hash of it (a short secret's hash is its value to anyone who tries them all);
  any other value that is a URL with a password in it is recorded with the password masked. The
  contract's own env (`env`) is recorded as written: it is declared in a file the team shares.
- store URLs (`postgresql://user:pass@host/db?sslpassword=...`): recorded and printed by
  `redact_url`, which keeps only what names the store (scheme, user, host, port, database and the
  query keys in SAFE_QUERY_KEYS); `scrub` removes a URL's secrets from any text (a driver's error
  message may quote the connection string, or only its password).

A leaf: the standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from urllib.parse import unquote, unquote_plus

REDACTED = "<redacted>"
MASK = "***"
# Names that hold secrets, matched anywhere in the upper-cased name: HF_TOKEN, VLLM_API_KEY,
# AWS_SECRET_ACCESS_KEY, PGPASSWORD, GH_AUTH, ... TOKENIZERS_PARALLELISM is a setting, not a token.
SECRET_NAME = re.compile(
    r"TOKEN(?!IZER)|KEY|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|PRIVATE|SIGNATURE"
)
# The query keys of a libpq URL that name the store and hold no secret; every other key's value
# (password, sslpassword, options, passfile, ...) is masked.
SAFE_QUERY_KEYS = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "sslmode",
        "connect_timeout",
        "application_name",
        "target_session_attrs",
        "gssencmode",
        "channel_binding",
    }
)
# scheme://userinfo@: the userinfo's part after its first ':' is the password. Greedy to the last '@'
# before the host, as a URL parser reads it; a URL ends at whitespace or a quote.
_URL = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<rest>[^\s'\"<>]*)")
# A store given as one argument is a URL to its end, spaces and quotes included.
_WHOLE_URL = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://)(?P<rest>.*)", re.DOTALL)


def is_secret_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a secret (SECRET_NAME)."""
    return SECRET_NAME.search(name.upper()) is not None


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """The env as qgate records it: secret names' values REDACTED, URLs' passwords masked."""
    return {k: REDACTED if is_secret_name(k) else redact_urls(v) for k, v in env.items()}


def redact_url(url: str) -> str:
    """A URL without its secrets: the password of its user part and the value of every query key but
    SAFE_QUERY_KEYS masked. Works on text no URL parser accepts (a bad percent escape, a bad port)."""
    match = _WHOLE_URL.fullmatch(url)
    if match is None:
        return url
    return match["head"] + _redact_rest(match["rest"])


def redact_urls(text: str) -> str:
    """Every URL in the text passed through redact_url."""
    return _URL.sub(lambda m: m["head"] + _redact_rest(m["rest"]), text)


def _redact_rest(rest: str) -> str:
    rest, hash_mark, fragment = rest.partition("#")
    rest, question, query = rest.partition("?")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        userinfo, host = authority.rsplit("@", 1)
        if ":" in userinfo:
            authority = f"{userinfo.split(':', 1)[0]}:{MASK}@{host}"
    if question:
        query = "&".join(_redact_pair(pair) for pair in query.split("&"))
    return f"{authority}{slash}{path}{question}{query}{hash_mark}{MASK if fragment else ''}"


def _redact_pair(pair: str) -> str:
    key, eq, _ = pair.partition("=")
    if not eq or unquote(key).lower() in SAFE_QUERY_KEYS:
        return pair
    return f"{key}={MASK}"


def url_secrets(url: str) -> list[str]:
    """The secret parts of a URL (its password, the values of its unsafe query keys), each as written
    and decoded, longest first: what `scrub` removes from a message about the URL."""
    match = _WHOLE_URL.fullmatch(url)
    if match is None:
        return []
    rest = match["rest"].partition("#")[0]
    rest, _, query = rest.partition("?")
    authority = rest.partition("/")[0]
    found = []
    if "@" in authority:
        userinfo = authority.rsplit("@", 1)[0]
        if ":" in userinfo:
            found.append(userinfo.split(":", 1)[1])
    for pair in query.split("&") if query else []:
        key, eq, value = pair.partition("=")
        if eq and unquote(key).lower() not in SAFE_QUERY_KEYS:
            found.append(value)
    # A short one would mask unrelated words of the message (a 2-character password is no secret).
    forms = {form for part in found for form in (part, unquote(part), unquote_plus(part))}
    forms |= {value for form in list(forms) for value in re.findall(r"=([^\s&]+)", form)}  # options=-c k=v
    # A bad percent escape: a driver may quote the part before or after it.
    forms |= {piece for form in list(forms) for piece in re.split(r"%(?![0-9A-Fa-f]{2})", form)}
    out = {form for form in forms if len(form) >= 3}
    return sorted(out, key=len, reverse=True)


def scrub(text: str, urls: Iterable[str]) -> str:
    """The text with every URL in it redacted and the secrets of `urls` (url_secrets) masked wherever
    they appear (a driver's error may quote a password alone, decoded)."""
    text = redact_urls(text)
    for url in urls:
        for secret in url_secrets(url):
            text = text.replace(secret, MASK)
    return text
