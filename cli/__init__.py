"""fencelog's command line: a thin Typer layer over broker.client. Only cli/ imports rich."""
