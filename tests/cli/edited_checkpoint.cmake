# A copy of a checkpoint directory with one config.json field changed (a test fixture): the other files are linked,
# config.json is written with "FIELD": VALUE in place of the original value.
#   cmake -DFROM=dir -DTO=dir -DFIELD=max_position_embeddings -DVALUE=64 -P edited_checkpoint.cmake
file(REMOVE_RECURSE "${TO}")
file(MAKE_DIRECTORY "${TO}")
file(GLOB files RELATIVE "${FROM}" "${FROM}/*")
foreach(f IN LISTS files)
  if(NOT f STREQUAL "config.json")
    file(CREATE_LINK "${FROM}/${f}" "${TO}/${f}" SYMBOLIC)
  endif()
endforeach()
file(READ "${FROM}/config.json" config)
string(REGEX REPLACE "\"${FIELD}\": *[^,}]+" "\"${FIELD}\": ${VALUE}" edited "${config}")
if(edited STREQUAL config)
  message(FATAL_ERROR "edited_checkpoint: no field '${FIELD}' in ${FROM}/config.json")
endif()
file(WRITE "${TO}/config.json" "${edited}")
