/* The tern command's subcommands. */
#ifndef TERN_APP_H
#define TERN_APP_H

int tern_app_serve(int argc, char **argv);

#endif
