"""Local HTTP servers that emulate the subset of Drive, Gmail, Graph and Stripe that Tidemark
uses, with fault injection. The real client libraries talk to them by changing a base URL."""
