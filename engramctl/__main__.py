from engramctl.cli import main

main()
