"""The token path: `POST /v1/runtimes/{runtimeID}/token`, guard → reserve → register → token.

`token_issuer` (the use case), `registrar` (which Compass runtime a token is for: a refusal
remembered, a runtime known, registered now, or lost and registered again) and `status_later`
(the status writes no answer waits for).

Inside the broker, import the defining module, never this package.
"""

__all__: list[str] = []  # import the defining modules: re-exports here would make cycles
