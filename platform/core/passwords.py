"""Baton's one password policy and hash, for every way a password is set: console sign-up, users made by
operators (console and admin API), password resets, the CLI's operator accounts.

A password has 12 to 256 characters, is not blank, uses more than a few distinct characters, and is not a
common password (nor one with digits or symbols stuck to either end: "Password2026!"), checked against a
small bundled list of the passwords that top every breach list. Passwords are kept as argon2 hashes.
"""

from __future__ import annotations

import functools
import re

from baton.core import errors

MIN_LENGTH = 12
MAX_LENGTH = 256
MIN_DISTINCT = 5

#: The words behind the most common passwords of breach lists; a password that is one of them (any case),
#: or one of them with digits and symbols before or after it, is refused.
COMMON = frozenset({
    "password", "passw0rd", "p@ssword", "p@ssw0rd", "pass", "passwort", "motdepasse", "contraseña", "senha",
    "wachtwoord", "qwerty", "qwertyuiop", "qwertz", "azerty", "asdfgh", "asdfghjkl", "zxcvbn", "zxcvbnm",
    "1q2w3e4r", "1qaz2wsx", "qazwsx", "letmein", "welcome", "welcomeback", "admin", "administrator", "root",
    "changeme", "default", "secret", "secretpassword", "iloveyou", "trustno1", "monkey", "dragon", "master",
    "shadow", "sunshine", "princess", "football", "baseball", "superman", "batman", "starwars", "whatever",
    "freedom", "hello", "hellothere", "login", "abc", "abcd", "abcdef", "abcdefg", "abcdefgh",
    "abcdefghijkl", "baton", "batonadmin", "console", "operator", "tenant",
})
_ENDS = re.compile(r"^[\W\d_]+|[\W\d_]+$")


def check(password: str) -> None:
    """Raises :class:`errors.ValidationError` (param ``password``) for a password the policy refuses."""
    def refuse(message: str) -> errors.ValidationError:
        return errors.ValidationError(message, param="password")

    if len(password) < MIN_LENGTH:
        raise refuse(f"The password needs at least {MIN_LENGTH} characters.")
    if len(password) > MAX_LENGTH:
        raise refuse(f"The password has at most {MAX_LENGTH} characters.")
    if not password.strip():
        raise refuse("The password cannot be only spaces.")
    if len(set(password)) < MIN_DISTINCT:
        raise refuse(f"The password needs at least {MIN_DISTINCT} different characters.")
    core = _ENDS.sub("", password.lower()).replace(" ", "")
    if password.lower() in COMMON or core in COMMON or not core.strip():
        raise refuse("This password is too common; choose another (a few unrelated words make a good one).")


@functools.cache
def _hasher():  # type: ignore[no-untyped-def]
    from argon2 import PasswordHasher  # deferred: only processes that check passwords load argon2

    return PasswordHasher()


def hash_password(password: str) -> str:
    """The argon2 hash of a password the policy accepts (:func:`check` first)."""
    check(password)
    return str(_hasher().hash(password))
