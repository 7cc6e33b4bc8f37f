"""Local HTTP servers that emulate the parts of Drive, Gmail, Graph and Stripe we use.

They emulate the subset of those APIs that Tidemark uses, with fault injection. The real client
libraries talk to them by changing a base URL."""
