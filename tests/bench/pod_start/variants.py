"""The agents the pod-start benchmark compares: the code as it ships, and the same code with one
hand-built hot-path piece swapped for its plain form (`plain_forms.py`), each with records
flushed or not."""

from pathlib import Path

import msgspec

PLAIN_FORMS = Path(__file__).with_name("plain_forms.py")


class Variant(msgspec.Struct, frozen=True):
    name: str
    plain: tuple[str, ...]  # plain_forms.PIECES keys
    flush_records: bool
    what: str

    def overlay(self, source: Path) -> None:
        """Edits the copy of the sources the variant's wheel is built from: the plain forms as a
        module of the package, applied at the end of the package's import; aiohttp as a
        dependency where the HTTP client is swapped."""
        if not self.plain:
            return
        package = source / "dra_driver"
        (package / "_plain_forms.py").write_text(PLAIN_FORMS.read_text())
        with (package / "__init__.py").open("a") as init:
            init.write(f"\nfrom dra_driver import _plain_forms\n\n_plain_forms.apply({list(self.plain)!r})\n")
        if "http-client" in self.plain:
            pyproject = source / "pyproject.toml"
            text = pyproject.read_text()
            marker = "dependencies = [\n"
            if marker not in text:
                raise ValueError(f"{pyproject}: no {marker.strip()!r} line to add aiohttp to")
            pyproject.write_text(text.replace(marker, marker + '  "aiohttp>=3.9,<4",\n', 1))


VARIANTS = (
    Variant("shipped", (), False, "the agent as it ships (records not flushed, the chart's default)"),
    Variant("one-lock", ("claim-locks",), False, "one node-wide lock for every claim (flock)"),
    Variant("call-lock", ("call-lock",), False, "one node-wide lock held for each whole call (upstream's)"),
    Variant("aiohttp", ("http-client",), False, "aiohttp in place of the own HTTP/1.1 client"),
    Variant("shipped-flushed", (), True, "as it ships, with --flush-records"),
)


def variants_named(names: list[str]) -> list[Variant]:
    known = {variant.name: variant for variant in VARIANTS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"--variants: unknown {', '.join(unknown)}; expected some of {', '.join(known)}")
    return [known[name] for name in names]
