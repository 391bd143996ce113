from bno_hvd.cli.main import main

main()
