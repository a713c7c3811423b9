"""Revocation: an operator stops a runtime from getting tokens and reporting, without
unregistering it.

`revocation_rules` (pure) says whether a proven runtime is revoked (the mapping's annotation, or
its client certificate's hash on the xfcc deny list) and reads the deny list format;
`deny_list_file` keeps the deny list file current while the broker runs; `revocation_gate` is the
use case that refuses a revoked runtime. Inside the broker, import these modules, not this
package.
"""
