"""One module per command, named like it: setup -> loop -> save. Commands import the library, never each other."""
