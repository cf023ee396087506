#!/usr/bin/env python3
"""Writes the generated parts of deploy/helm/dra-driver/values.schema.json (see
dra_driver/tools/manifests/chart_schema.py): run it after changing a decoder, the GPU catalog or
the node profiles (`make chart-schema`); tests/api/test_chart_schema.py fails until the committed
file is regenerated.

Usage: hack/gen-chart-schema.py [--output PATH]
"""

import argparse
import json
from pathlib import Path

from dra_driver.tools.manifests.chart_schema import with_generated_parts

SCHEMA = Path(__file__).resolve().parent.parent / "deploy" / "helm" / "dra-driver" / "values.schema.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=SCHEMA)
    arguments = parser.parse_args()
    schema = with_generated_parts(json.loads(SCHEMA.read_text()))
    arguments.output.write_text(json.dumps(schema, indent=2) + "\n")


if __name__ == "__main__":
    main()
