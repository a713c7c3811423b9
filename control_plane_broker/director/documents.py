"""The GraphQL documents the broker sends to Director, as constants.

Each is validated against Director's published schema in a test, so a field or argument that
Director does not have fails the build, not production.
"""

from __future__ import annotations

RUNTIME_FIELDS = "id name labels"

RUNTIMES_BY_LABEL = f"""
query RuntimesByLabel($filter: [LabelFilter!], $first: Int, $after: PageCursor) {{
  runtimes(filter: $filter, first: $first, after: $after) {{
    data {{ {RUNTIME_FIELDS} }}
    pageInfo {{ hasNextPage endCursor }}
  }}
}}
"""

REGISTER_RUNTIME = f"""
mutation RegisterRuntime($in: RuntimeRegisterInput!) {{
  registerRuntime(in: $in) {{ {RUNTIME_FIELDS} }}
}}
"""

RUNTIME_BY_ID = f"""
query Runtime($id: ID!) {{
  runtime(id: $id) {{ {RUNTIME_FIELDS} }}
}}
"""

UNREGISTER_RUNTIME = """
mutation UnregisterRuntime($id: ID!) {
  unregisterRuntime(id: $id) { id }
}
"""

REQUEST_OTT = """
mutation RequestOneTimeTokenForRuntime($id: ID!) {
  requestOneTimeTokenForRuntime(id: $id) { token connectorURL used expiresAt }
}
"""

SET_RUNTIME_LABEL = """
mutation SetRuntimeLabel($runtimeID: ID!, $key: String!, $value: Any!) {
  setRuntimeLabel(runtimeID: $runtimeID, key: $key, value: $value) { key value }
}
"""

ALL_DOCUMENTS: dict[str, str] = {
    "RuntimesByLabel": RUNTIMES_BY_LABEL,
    "RegisterRuntime": REGISTER_RUNTIME,
    "Runtime": RUNTIME_BY_ID,
    "UnregisterRuntime": UNREGISTER_RUNTIME,
    "RequestOneTimeTokenForRuntime": REQUEST_OTT,
    "SetRuntimeLabel": SET_RUNTIME_LABEL,
}
