"""Text that leaves the process: provider error text scrubbed of anything that looks like a key before it is
stored or printed, and control characters escaped before anything reaches a terminal (a hostile file name or
document must not retitle, clear or rewrite the user's terminal)."""

from __future__ import annotations

import os
import re

MASK = "[redacted]"
_KEY_PATTERNS = re.compile(
    r"(?i)\b(?:bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"            # Authorization header values
    r"|\bsk-[A-Za-z0-9_-]{8,}"                                     # OpenAI / Anthropic style
    r"|\bAIza[0-9A-Za-z_-]{20,}"                                   # Google
    r"|\b(?:ghp|gho|ghs|github_pat|hf|xox[abprs]|glpat)_?-?[A-Za-z0-9_-]{16,}"
    r"|\bAKIA[0-9A-Z]{16}\b"                                       # AWS access key id
    r"|\b(?:api[_-]?key|x-api-key|access[_-]?token|secret|password|authorization)"
    r"[\"']?\s*[:=]\s*[\"']?[^\s\"',;}&]{6,}"                      # key=value / "key": "value"
)
_SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASS|AUTH)", re.I)


def scrub(text: str) -> str:
    """`text` with secrets masked: the values of this process's key-like environment variables wherever they
    appear, and anything shaped like a known key format or a key=value pair."""
    for name, value in os.environ.items():
        if len(value) >= 8 and _SECRET_ENV.search(name) and value in text:
            text = text.replace(value, MASK)
    return _KEY_PATTERNS.sub(_mask_match, text)


def _mask_match(m: re.Match) -> str:
    s = m.group(0)
    sep = re.search(r"[:=]\s*[\"']?|\s+", s)
    if sep and not s.lower().startswith(("sk-", "aiza", "akia")):
        return s[: sep.end()] + MASK     # keep the key's name ("Bearer ", "api_key=") so the error still reads
    return MASK


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: str, keep_newlines: bool = True) -> str:
    """Control characters (ESC, BEL, C1 codes, bidi overrides ...) shown as \\xNN / \\uNNNN escapes; tabs and,
    unless told otherwise, newlines kept."""
    out = _CONTROL.sub(lambda m: _escape(m.group(0)), str(text))
    return out if keep_newlines else out.replace("\n", "\\n")


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
