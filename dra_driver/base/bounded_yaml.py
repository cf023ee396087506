"""YAML from operators (node configs, simulated nodes, the XID policy, kubeconfigs), decoded only
after a scan proves it cheap to decode.

An alias is a reference, so ten lines of nested aliases stand for billions of values: PyYAML
builds them cheaply as shared objects, but everything that walks them afterwards (a decoder, an
error message quoting the value) does the whole work, which drove `validate-config` to 4 GB with
no output and would have the agent OOM-killed in a loop (issue 33). None of these documents needs
an alias, so any alias is refused, as are documents over a size and nesting bound; the scan walks
the parser's events, never a built value, so a refusal costs one linear pass. The same pass
refuses a key given twice in one mapping, naming both lines, which PyYAML would resolve by
keeping the last without a word.
"""

import yaml

from dra_driver.base.errors import OperatorFault

# A ConfigMap holds at most 1 MiB in all, so no node config that can reach a node is larger; a
# kubeconfig with a dozen clusters' certificates is tens of KiB.
MAX_BYTES = 2**20
# Collections inside collections. A node config is 6 deep at most (gpus[].vgpu.partitions[]),
# a kubeconfig 4; the bound is far above both and far below Python's recursion limit, which the
# pure-Python constructor would otherwise meet as a RecursionError.
MAX_DEPTH = 32
# libyaml's parser where PyYAML has it (as hardware.catalog uses), with the same safe constructor.
_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class YamlProblem(OperatorFault, ValueError):
    """Why the text is not a document the driver decodes, on one line without the file's name
    (the caller knows which file or flag it was)."""


def yaml_problem(error: yaml.YAMLError) -> str:
    """PyYAML's message on one line, with its line and column (1-based); its own message names
    the stream ("<unicode string>") and quotes the source over several lines."""
    if isinstance(error, yaml.MarkedYAMLError) and error.problem_mark is not None:
        mark = error.problem_mark
        return f"{error.problem} at line {mark.line + 1}, column {mark.column + 1}"
    return " ".join(str(error).split())


def _where(event: yaml.Event) -> str:
    mark = event.start_mark
    return "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"


class _Mapping:
    """A mapping being scanned: whether its next node is a key, and the line of each key seen."""

    def __init__(self) -> None:
        self.at_key = True
        self.keys: dict[str, int] = {}

    def node(self, event: yaml.NodeEvent) -> None:
        """A key is compared by its text: `a` and "a" are one key to YAML too. A duplicate would
        otherwise replace the earlier value without a word (PyYAML keeps the last)."""
        if self.at_key and isinstance(event, yaml.ScalarEvent) and event.start_mark is not None:
            line = event.start_mark.line + 1
            if (first := self.keys.get(event.value)) is not None:
                raise YamlProblem(
                    f"key {event.value[:40]!r} at line {line} is given twice (first at line {first}): "
                    "the second would silently replace the first"
                )
            self.keys[event.value] = line
        self.at_key = not self.at_key


def _scan(text: str) -> None:
    # One entry per open collection: a _Mapping, or None for a sequence.
    open_collections: list[_Mapping | None] = []
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.AliasEvent):
            raise YamlProblem(
                f"an alias (*{(event.anchor or '')[:40]}){_where(event)}: aliases are refused in "
                "these files (write the value out)"
            )
        if isinstance(event, yaml.NodeEvent) and open_collections and open_collections[-1] is not None:
            open_collections[-1].node(event)
        if isinstance(event, yaml.CollectionStartEvent):
            open_collections.append(_Mapping() if isinstance(event, yaml.MappingStartEvent) else None)
            if len(open_collections) > MAX_DEPTH:
                raise YamlProblem(f"nested more than {MAX_DEPTH} levels deep{_where(event)}")
        elif isinstance(event, yaml.CollectionEndEvent):
            open_collections.pop()


def load_bounded_yaml(text: str | bytes) -> object:
    """The one document in `text`, or YamlProblem: over MAX_BYTES, not UTF-8, not YAML, an alias
    anywhere, a key given twice in one mapping, or nested more than MAX_DEPTH deep."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise YamlProblem(f"larger than {MAX_BYTES >> 20} MiB, the most a node config or kubeconfig needs")
    try:
        decoded = text.decode("utf-8") if isinstance(text, bytes) else text
    except UnicodeDecodeError as error:
        raise YamlProblem(f"not UTF-8 text: byte {error.start} cannot be decoded") from None
    try:
        _scan(decoded)
        return yaml.load(decoded, Loader=_LOADER)
    except yaml.YAMLError as error:
        raise YamlProblem(f"not valid YAML: {yaml_problem(error)}") from None
