"""The TEI flags a tenant may add with ``pools.<pool>.tei.extraArgs``: an allow-list, each flag with its value check.

Why an allow-list: TEI (clap) accepts short forms (``-p``), hidden deprecated aliases (``--hf-api-token``) and
environment variables for every flag, so a deny-list of the flags the operator sets always leaks. Only flags that
tune serving are allowed, and only in the one-argument form ``--flag=value`` (a separate value argument could be
read as a flag of its own). Flags the operator sets (``--model-id``, ``--revision``, ``--port``, ``--hostname``,
``--json-output``, ``--dtype`` and the ``tei.*`` settings) and secrets (``--api-key``, ``--hf-token``: a spec is
readable by everyone with ``view`` on the namespace, and a command line by everyone who can read the pod) are
never allowed; secrets come only from Secret references (``tei.apiKeySecretRef``, ``model.tokenSecretRef``).

crds/rerankmodel.yaml enforces the same list at apply time (CEL on ``extraArgs``);
tests/unit/operator/core/spec/test_tei_flags.py checks that both agree. The operator checks again (``spec.parse``)
because an object stored before the rule existed is never re-validated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Flag:
    """One allowed flag: the whole argument must match ``pattern``; ``expects`` says what the value may be."""

    pattern: str
    expects: str


ALLOWED: dict[str, Flag] = {
    "--tokenization-workers": Flag(r"^--tokenization-workers=[1-9][0-9]{0,2}$", "an integer from 1 to 999"),
    "--max-batch-requests": Flag(r"^--max-batch-requests=[1-9][0-9]{0,5}$", "an integer from 1 to 999999"),
    "--payload-limit": Flag(r"^--payload-limit=[1-9][0-9]{0,8}$", "a number of bytes from 1 to 999999999"),
    "--served-model-name": Flag(r"^--served-model-name=[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$",
                                "a name of letters, digits, '.', '_', '-' and '/' (at most 128)"),
    "--disable-spans": Flag(r"^--disable-spans$", "no value"),
}

SECRET_FLAGS = ("--api-key", "--hf-token", "--hf-api-token")


def flag_name(arg: str) -> str:
    """The flag an argument names: the part before '=' (the whole argument without one)."""
    return arg.split("=", 1)[0]


def refusals(args: Sequence[str], field: str = "tei.extraArgs") -> list[str]:
    """One message per problem in ``args``, naming the flag (never a secret's value); empty when all is well."""
    found: list[str] = []
    seen: set[str] = set()
    for arg in args:
        name = flag_name(arg)
        if name not in ALLOWED:
            hint = (" secrets come only from Secret references (tei.apiKeySecretRef, model.tokenSecretRef)"
                    if name in SECRET_FLAGS else f" allowed are {', '.join(ALLOWED)}")
            found.append(f"{field}: flag {name} is not allowed;{hint}")
        elif not re.fullmatch(ALLOWED[name].pattern.strip("^$"), arg):
            takes = (f"{ALLOWED[name].expects}, as {name}=<value>" if ALLOWED[name].expects != "no value"
                     else "no value")
            found.append(f"{field}: {arg} is not valid: {name} takes {takes}")
        elif name in seen:
            found.append(f"{field}: flag {name} is given more than once")
        seen.add(name)
    return found
