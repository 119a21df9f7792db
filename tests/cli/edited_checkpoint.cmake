# A copy of a checkpoint directory with one field changed (a test fixture): the other files are linked, the edited
# file is written with "FIELD": VALUE in place of the original value.
#   cmake -DFROM=dir -DTO=dir -DFIELD=max_position_embeddings -DVALUE=64 -P edited_checkpoint.cmake
#   cmake ... -DFILE=tokenizer_config.json -DFIELD=chat_template "-DVALUE=\"{% if %}\"" -P edited_checkpoint.cmake
# FILE (default config.json): the file to edit. VALUE is JSON text (a number as is, a string in quotes).
if(NOT FILE)
  set(FILE config.json)
endif()
file(REMOVE_RECURSE "${TO}")
file(MAKE_DIRECTORY "${TO}")
file(GLOB files RELATIVE "${FROM}" "${FROM}/*")
foreach(f IN LISTS files)
  if(NOT f STREQUAL FILE)
    file(CREATE_LINK "${FROM}/${f}" "${TO}/${f}" SYMBOLIC)
  endif()
endforeach()
file(READ "${FROM}/${FILE}" original)
string(JSON before ERROR_VARIABLE missing GET "${original}" "${FIELD}")
if(missing)
  message(FATAL_ERROR "edited_checkpoint: no field '${FIELD}' in ${FROM}/${FILE}")
endif()
string(JSON edited SET "${original}" "${FIELD}" "${VALUE}")
file(WRITE "${TO}/${FILE}" "${edited}")
