from kpgo.cli import entry

entry()
