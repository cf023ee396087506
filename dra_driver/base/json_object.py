"""The one name for a JSON object as the driver builds and reads it (an API object, a status
entry, a request body): decoded JSON is a dict, and its values are checked where they are read."""

from typing import Any

JsonObject = dict[str, Any]
