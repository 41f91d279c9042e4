# Build-time step (report/CMakeLists.txt): writes OUT, a C++ file defining
# kvsim::report::assets::NAME as each file of ASSETS (a ;-list) in a raw
# string literal, so the pages carry their CSS and JavaScript with no file to
# find at run time and nothing fetched.
set(text "// Generated from report/assets/ by report/embed_assets.cmake; edit those files instead.\n")
string(APPEND text "#include <string_view>\nnamespace kvsim::report::assets {\n")
foreach(asset IN LISTS ASSETS)
  file(READ ${asset} content)
  if(content MATCHES "\\)kvsim_asset\"")
    message(FATAL_ERROR "${asset} holds the raw-string delimiter )kvsim_asset\"")
  endif()
  get_filename_component(name ${asset} NAME)
  string(MAKE_C_IDENTIFIER ${name} id)
  string(APPEND text "extern const std::string_view ${id};\nconst std::string_view ${id} = R\"kvsim_asset(${content})kvsim_asset\";\n")
endforeach()
string(APPEND text "}  // namespace kvsim::report::assets\n")
file(WRITE ${OUT}.tmp "${text}")
file(COPY_FILE ${OUT}.tmp ${OUT} ONLY_IF_DIFFERENT)
