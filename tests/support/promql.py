"""PromQL for tests: the metric names a query reads (parsed by a real PromQL parser), and a small
evaluator for the comparison alerts we ship, run against samples scraped from the agent."""

from collections.abc import Iterator, Mapping

import promql_parser

Labels = tuple[tuple[str, str], ...]
Samples = Mapping[tuple[str, Labels], float]


def _children(node: object) -> Iterator[object]:
    for attribute in ("lhs", "rhs", "expr", "args", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if isinstance(child, list | tuple):
            yield from child
        elif child is not None:
            yield child


def metric_names(query: str) -> set[str]:
    """Every metric a query selects; raises ValueError where the parser rejects the query."""
    names: set[str] = set()
    pending: list[object] = [promql_parser.parse(query)]
    while pending:
        node = pending.pop()
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name or next((m.value for m in node.matchers.matchers if m.name == "__name__"), None)
            assert name, f"a selector without a metric name in {query!r}"
            names.add(name)
        pending.extend(_children(node))
    return names


def _selected(selector: "promql_parser.VectorSelector", samples: Samples) -> dict[Labels, float]:
    wanted = {m.name: m.value for m in selector.matchers.matchers}
    return {
        labels: value
        for (name, labels), value in samples.items()
        if name == selector.name and all(dict(labels).get(k, "") == v for k, v in wanted.items())
    }


def firing(query: str, samples: Samples) -> set[Labels]:
    """The series a `<selector> > <selector>` alert (one-to-one on all labels) fires for."""
    expr = promql_parser.parse(query)
    assert isinstance(expr, promql_parser.BinaryExpr) and str(expr.op) == ">", query
    assert isinstance(expr.lhs, promql_parser.VectorSelector), query
    assert isinstance(expr.rhs, promql_parser.VectorSelector), query
    lhs, rhs = _selected(expr.lhs, samples), _selected(expr.rhs, samples)
    return {labels for labels, value in lhs.items() if labels in rhs and value > rhs[labels]}
