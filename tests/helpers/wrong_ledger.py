"""A deliberately wrong ledger action, for showing that the kit and `tidemark chaos` catch it."""

from __future__ import annotations

from tidemark_ledger.action import PostInvoice

from tidemark.actions import ProbeResult, StepContext


class ByReference(PostInvoice):
    """The essay's Drive mistake, on the ledger: the probe matches an invoice by its name.

    It matches on what the invoice is called (customer and reference), not on who posted it. So
    another invoice of the same name (a second instalment, a clerk's entry) passes for ours."""

    def probe(self, ctx: StepContext) -> ProbeResult:
        found = [i for i in self.reader.invoices(customer=ctx.args["customer"],
                                                 reference=ctx.args["reference"])
                 if i["status"] == "posted"]
        if found:
            return ProbeResult.done({"id": found[0]["id"]}, "an invoice with our reference")
        return ProbeResult.absent("no invoice with our reference")
