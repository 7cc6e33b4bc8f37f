"""An invoice ledger as a Tidemark plugin.

It holds the action ``ledger.post_invoice`` and the ledger's own staging server. The worked
example of docs/writing-an-action.md."""
