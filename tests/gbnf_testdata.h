/* gbnf_testdata.h - a GBNF grammar the GBNF tests share: JSON in
 * llama.cpp's style (json.gbnf's shape), with optional white space and
 * comments, line continuations inside parentheses and after '|'. */
#ifndef SPILLWAY_TESTS_GBNF_TESTDATA_H
#define SPILLWAY_TESTS_GBNF_TESTDATA_H

static const char *const tu_gbnf_json =
    "# JSON, with optional white space\n"
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "    string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1F] |\n"
    "  \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* "
    "\"\\\"\" ws\n"
    "number ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? ws\n"
    "ws     ::= | [ \\t\\n] ws\n";

#endif
