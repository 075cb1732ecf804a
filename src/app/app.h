/* The tern command's subcommands. */
#ifndef TERN_APP_H
#define TERN_APP_H

int tern_app_serve(int argc, char **argv);
/* argv[0] is "load", argv[1] the mode (echo or pipeline). */
int tern_app_load(int argc, char **argv);

#endif
