# cmake -P script: install rope into a scratch prefix, then build and run the consumer.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${ROPE_BINARY_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE status)
if(status)
    message(FATAL_ERROR "cmake --install failed: ${status}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${CONSUMER_SOURCE_DIR} -B ${WORK_DIR}/build -G ${GENERATOR}
                        -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix -DCMAKE_BUILD_TYPE=Release
                RESULT_VARIABLE status)
if(status)
    message(FATAL_ERROR "configuring the consumer with find_package(rope) failed: ${status}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE status)
if(status)
    message(FATAL_ERROR "building the consumer failed: ${status}")
endif()
execute_process(COMMAND ${WORK_DIR}/build/consumer RESULT_VARIABLE status)
if(status)
    message(FATAL_ERROR "the consumer ran but got the wrong answer: ${status}")
endif()
message(STATUS "find_package(rope) consumer built and passed")
